"""What every GPU phase shares: the deadline, host-RAM sampling, the server log's timing lines, JSON out.

NVML sampling and the ComfyUI/websocket plumbing are the ones bench/gpu_comfyui_e2e.py already has
(`Gpu`, `Comfy`, `Websocket`); `legacy()` imports that script's module for them.
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
GIB = 1 << 30
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vllm-omni 0.30 pipeline_wan2_2.py, with its DEBUG_PERF switch on (the device setup turns it on)
STAGE_LINE = re.compile(
    r"Pipeline stage timing summary: TextEncoding=([\d.]+) ms, LatentPreparation=([\d.]+) ms, "
    r"Denoising=([\d.]+) ms \((\d+) steps\), Decoding=([\d.]+) ms, StagesSum=[\d.]+ ms, PipelineWall=([\d.]+) ms")
MP4_LINE = re.compile(r"Video response encoding \(MP4 bytes\): ([\d.]+) ms")
TQDM_RATE = re.compile(r"(\d+)/(\d+) \[[^\]]*?([\d.]+)(s/it|it/s)\]")


def legacy() -> Any:
    """bench/gpu_comfyui_e2e.py as a module (its Gpu / Comfy / Websocket / node_of / load_api)."""
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_comfyui_e2e

    return gpu_comfyui_e2e


class Deadline:
    """Seconds left of a device call, and whether a step of `need_s` still fits."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def fits(self, need_s: float) -> bool:
        return self.left() >= need_s


def stage_timings(log_text: str) -> list[dict[str, float]]:
    """Per job, the server's own stage seconds (text encode, latents, denoise, VAE decode, pipeline)."""
    out = []
    for m in STAGE_LINE.finditer(_ANSI.sub("", log_text)):
        te, lat, den, steps, dec, wall = m.groups()
        out.append({"text_encode_s": float(te) / 1000, "latent_prep_s": float(lat) / 1000,
                    "denoise_s": float(den) / 1000, "steps": int(steps), "vae_decode_s": float(dec) / 1000,
                    "pipeline_s": float(wall) / 1000})
    return out


def mp4_encode_s(log_text: str) -> list[float]:
    return [float(x) / 1000 for x in MP4_LINE.findall(_ANSI.sub("", log_text))]


def last_step_rate(log_text: str) -> Optional[float]:
    """Seconds per denoise step from the last tqdm line (rank 0's progress bar), None if none."""
    found = TQDM_RATE.findall(_ANSI.sub("", log_text).replace("\r", "\n"))
    if not found:
        return None
    _, _, value, unit = found[-1]
    v = float(value)
    return v if unit == "s/it" else (1.0 / v if v else None)


class RamSampler:
    """RSS of a process tree every 0.5 s: the root and its descendants, the server's processes apart
    (a descendant whose command line names vllm or the stub server)."""

    def __init__(self, root_pid: Optional[int] = None, interval: float = 0.5) -> None:
        import psutil

        self.psutil = psutil
        self.root = root_pid or os.getpid()
        self.samples: list[tuple[float, int, int]] = []     # (t, root-side bytes, server-side bytes)
        self._stop = threading.Event()
        self.interval = interval
        threading.Thread(target=self._loop, daemon=True).start()

    def _read(self) -> tuple[int, int]:
        p = self.psutil
        root = p.Process(self.root)
        own, server = root.memory_info().rss, 0
        for child in root.children(recursive=True):
            try:
                rss = child.memory_info().rss
                cmd = " ".join(child.cmdline())
            except (p.NoSuchProcess, p.AccessDenied):
                continue
            if "vllm" in cmd or "stub_vllm_serve" in cmd:
                server += rss
            else:
                own += rss
        return own, server

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                own, server = self._read()
                self.samples.append((time.monotonic(), own, server))
            except Exception:   # the root went away: keep what was sampled
                pass
            self._stop.wait(self.interval)

    def peak_gib(self, since: float, until: Optional[float] = None) -> dict[str, Optional[float]]:
        window = [s for s in self.samples if s[0] >= since and (until is None or s[0] <= until)]
        if not window:
            return {"process_gib": None, "server_gib": None, "total_gib": None}
        return {"process_gib": round(max(s[1] for s in window) / GIB, 2),
                "server_gib": round(max(s[2] for s in window) / GIB, 2),
                "total_gib": round(max(s[1] + s[2] for s in window) / GIB, 2)}

    def close(self) -> None:
        self._stop.set()


def save_json(path: Path, doc: Any) -> None:
    """Write atomically: a call cut at its limit leaves the last whole report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


def machine() -> dict[str, Any]:
    """The GPU (nvidia-smi; never a CUDA context in the driver, which would count in NVML's figures)."""
    import shutil
    import subprocess

    out: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        out["gpu"] = q.stdout.strip()
    return out
