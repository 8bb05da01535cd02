"""Start a real ComfyUI with this pack, and drive its HTTP API and its web page.

Used by ``run_real_comfyui.py`` (the check) and ``make_workflows.py`` (the template
generator). No pytest needed. The ComfyUI checkout is never modified: it runs with
``--base-directory`` pointing at a temporary folder whose ``custom_nodes/vllm-omni-launcher``
(the folder README's ``git clone`` and a Registry/Manager install make, so the tested layout is the
user's) is a symlink to this repository, and whose ``input/`` holds ComfyUI's own ``example.png``.

Browser: Playwright's Python package driving a system Chromium (``CHROMIUM`` or the first of
chromium / chromium-browser / google-chrome on PATH). ``playwright install`` is never needed.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

REPO = Path(__file__).resolve().parents[2]          # the pack (repository root)
PACK_NAME = "vllm-omni-launcher"                   # the folder README's install gives; ComfyUI loads it so
WORKFLOWS = REPO / "workflows"
OUR_NODES = ("VLLMOmniLoadModel", "VLLMOmniServingConfig", "VLLMOmniLocalServer", "VLLMOmniRemoteServer",
             "VLLMOmniGenerateVideo", "VLLMOmniStopServer", "VLLMOmniServerStatus", "VLLMOmniDoctor", "VLLMOmniLora",
             "VLLMOmniGenerateBatch", "VLLMOmniLoadPipelineModel", "VLLMOmniGenerateVACE",
             "VLLMOmniGenerateSpeechToVideo")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def comfyui_version(comfy_dir: Path) -> str:
    text = (comfy_dir / "comfyui_version.py").read_text()
    return text.split("__version__ =", 1)[1].strip().strip("\"'") if "__version__ =" in text else "unknown"


class ComfyUI:
    """One ComfyUI server process (its own process group) on a free port."""

    def __init__(self, comfy_dir: Path, python: str, env: Mapping[str, str], port: Optional[int] = None) -> None:
        self.comfy_dir = Path(comfy_dir).resolve()
        self.python = python
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.base = Path(tempfile.mkdtemp(prefix="comfyui-base-"))
        (self.base / "custom_nodes").mkdir()
        (self.base / "custom_nodes" / PACK_NAME).symlink_to(REPO, target_is_directory=True)
        (self.base / "input").mkdir()
        (self.base / "output").mkdir()
        (self.base / "user").mkdir()
        example = self.comfy_dir / "input" / "example.png"
        if example.is_file():
            shutil.copy2(example, self.base / "input" / "example.png")
        self.log_path = self.base / "comfyui.log"
        child_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user's ComfyUI runs
        child_env.update(env)
        child_env["PYTHONUNBUFFERED"] = "1"
        self.argv = [python, str(self.comfy_dir / "main.py"), "--cpu", "--listen", "127.0.0.1",
                     "--port", str(self.port), "--base-directory", str(self.base),
                     "--disable-all-custom-nodes", "--whitelist-custom-nodes", PACK_NAME,
                     "--disable-auto-launch", "--database-url", "sqlite:///:memory:"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, cwd=str(self.comfy_dir), stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT, env=child_env,
                                     start_new_session=True)

    # -- process --------------------------------------------------------------------------
    @property
    def output_dir(self) -> Path:
        return self.base / "output"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}; log:\n{self.log()[-6000:]}")
            with contextlib.suppress(OSError):
                self.get("/system_stats", timeout=2)
                return
            time.sleep(0.5)
        raise TimeoutError(f"ComfyUI not answering after {timeout:.0f}s; log:\n{self.log()[-6000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    def cleanup(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    # -- HTTP -----------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 30) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            body = r.read()
        return json.loads(body) if body[:1] in (b"{", b"[") else body

    def get_bytes(self, path: str, timeout: float = 60) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return r.read()

    def post(self, path: str, payload: Any, timeout: float = 30) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def view_url(self, filename: str, subfolder: str, kind: str) -> str:
        query = urllib.parse.urlencode({"filename": filename, "subfolder": subfolder, "type": kind})
        return "/view?" + query

    def queue(self, prompt: dict, client_id: Optional[str] = None) -> str:
        """POST an API-format prompt to /prompt; its prompt_id (AssertionError if refused)."""
        status, body = self.post("/prompt", {"prompt": prompt, "client_id": client_id or str(uuid.uuid4())})
        assert status == 200 and not body.get("node_errors"), f"/prompt refused it: {status} {body}"
        return body["prompt_id"]

    def interrupt(self, prompt_id: Optional[str] = None) -> None:
        """What the Cancel button does: POST /interrupt (for that prompt when given)."""
        status, _ = self.post("/interrupt", {"prompt_id": prompt_id} if prompt_id else {})
        assert status == 200, f"/interrupt answered {status}"

    def idle(self) -> bool:
        """Nothing running or pending in ComfyUI's queue."""
        queue = self.get("/queue")
        return not queue.get("queue_running") and not queue.get("queue_pending")

    def wait_history(self, prompt_id: str, timeout: float, poll: float = 1.0) -> dict:
        """The /history entry of a prompt once it has finished (completed or failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode}; log:\n{self.log()[-6000:]}")
            entry = self.get(f"/history/{prompt_id}").get(prompt_id)
            if entry and entry.get("status", {}).get("completed") is not None and (
                    entry["status"]["completed"] or entry["status"].get("status_str") == "error"):
                return entry
            time.sleep(poll)
        raise TimeoutError(f"prompt {prompt_id} not finished after {timeout:.0f}s; log tail:\n{self.log()[-6000:]}")


@contextlib.contextmanager
def running_comfyui(comfy_dir: Path, python: str, env: Mapping[str, str], keep: bool = False) -> Iterator[ComfyUI]:
    comfy = ComfyUI(comfy_dir, python, env)
    try:
        comfy.wait_ready()
        yield comfy
    finally:
        comfy.stop()
        if not keep:
            comfy.cleanup()


def put_media_inputs(input_dir: Path) -> None:
    """The files the VACE and S2V templates' loaders name (control.mp4: 100 frames of 1280x720 at 24 fps;
    speech.wav: 3 s at 22.05 kHz), made in ComfyUI's input folder as a user would upload them."""
    import wave

    import numpy as np

    from vllm_omni_launcher.client import media

    y, x = np.mgrid[0:720, 0:1280].astype(np.float32)
    frames = np.stack([np.stack([(x + 8 * i) % 1280 / 1280, y / 720, np.full_like(x, i / 100)], -1)
                       for i in range(100)])
    (input_dir / "control.mp4").write_bytes(media.control_video_from_frames(frames, fps=24).mp4)
    t = np.arange(22050 * 3) / 22050
    with wave.open(str(input_dir / "speech.wav"), "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(22050)
        writer.writeframes((np.sin(2 * np.pi * 220 * t) * 20000).astype("<i2").tobytes())


def pack_import_problems(log: str) -> list[str]:
    """Lines of ComfyUI's log saying our pack failed to import (other packs' failures are not ours)."""
    bad = []
    for line in log.splitlines():
        mentions_us = f"custom_nodes/{PACK_NAME}" in line or line.strip().endswith(PACK_NAME)
        if mentions_us and ("IMPORT FAILED" in line or "Cannot import" in line):
            bad.append(line.strip())
    return bad


def find_chromium() -> str:
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("No Chromium found: install it (Debian: apt-get install chromium) or set CHROMIUM")


@contextlib.contextmanager
def browser_page(url: str, width: int = 1280, height: int = 800) -> Iterator[tuple[Any, list]]:
    """A headless Chromium page on ComfyUI's front end, after the app has loaded its node definitions.

    Yields (page, console): console collects ("error"|"pageerror"|..., text, url) tuples (for a
    page error, its stack in place of the url: where it was thrown).
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        raise RuntimeError("The browser check needs the 'playwright' Python package (pip install playwright; "
                           "a system Chromium is used, no 'playwright install')") from exc
    user_dir = tempfile.mkdtemp(prefix="chromium-profile-")
    try:
        with sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(
                user_dir, executable_path=find_chromium(), headless=True, args=CHROMIUM_ARGS,
                viewport={"width": width, "height": height})
            try:
                page = ctx.pages[0] if ctx.pages else ctx.new_page()
                console: list = []
                page.on("console", lambda m: console.append((m.type, m.text, (m.location or {}).get("url", ""))))
                page.on("pageerror", lambda e: console.append(("pageerror", str(e), e.stack or "")))
                page.on("requestfailed", lambda r: console.append(("requestfailed", r.failure or "", r.url)))
                page.on("response", lambda r: console.append(("http", str(r.status), r.url))
                        if r.status >= 400 else None)
                page.goto(url, wait_until="domcontentloaded", timeout=120_000)
                page.wait_for_function(
                    "() => window.app && window.app.graph && window.LiteGraph && "
                    "window.LiteGraph.registered_node_types['VLLMOmniGenerateVideo'] !== undefined",
                    timeout=180_000)
                page.wait_for_timeout(1500)   # let the first (default) workflow settle
                yield page, console
            finally:
                ctx.close()
    finally:
        shutil.rmtree(user_dir, ignore_errors=True)


# Evaluated in the page: load one UI workflow the way the template browser does, and report
# what the front end made of it.
LOAD_AND_INSPECT_JS = """async ([graph, name]) => {
  await app.loadGraphData(graph, true, true, name);
  await new Promise(r => setTimeout(r, 800));
  const dialogs = Array.from(document.querySelectorAll('.p-dialog')).map(d => d.innerText.slice(0, 500));
  const nodes = app.graph._nodes.map(n => ({
    id: n.id, type: n.type, registered: LiteGraph.registered_node_types[n.type] !== undefined,
    has_errors: !!n.has_errors,
    widgets: (n.widgets || []).map(w => [w.name, w.value]),
  }));
  const prompt = await app.graphToPrompt();
  return {dialogs, nodes, api: prompt.output, workflow: JSON.stringify(prompt.workflow)};
}"""


def save_png(page: Any, path: Path) -> int:
    """Screenshot of the page as a 256-colour PNG (keeps the committed pictures small); its size."""
    from PIL import Image

    raw = page.screenshot(type="png")
    with Image.open(io.BytesIO(raw)) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
        path.parent.mkdir(parents=True, exist_ok=True)
        small.save(path, format="PNG", optimize=True)
    return path.stat().st_size


def close_dialogs(page: Any) -> None:
    page.evaluate("() => { try { window.app.extensionManager.dialog.closeDialog(); } catch (e) {} }")
    page.keyboard.press("Escape")


if __name__ == "__main__":   # manual use: start ComfyUI with the pack and keep it up until Ctrl-C
    comfy_dir = Path(os.environ.get("COMFYUI_DIR", "")).expanduser()
    if not (comfy_dir / "main.py").is_file():
        sys.exit("set COMFYUI_DIR to a ComfyUI checkout")
    with running_comfyui(comfy_dir, os.environ.get("COMFYUI_PYTHON", sys.executable), {}) as c:
        print(c.url, c.base, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            c.proc.wait()
