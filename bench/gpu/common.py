"""What every GPU bench phase shares (`python -m bench.gpu ...` and the scripts beside it in bench/): the
package the bench drives (this checkout or a pinned copy), the server command and environment, NVML
sampling, one server's run (start, stop and their report fields), the deadline, host-RAM sampling, the server
log's timing lines, JSON out.

The scripts (bench/gpu_e2e.py, gpu_comfyui_e2e.py, ...) import it as `gpu.common` (bench/ on sys.path); this
module imports none of them, so the bench has no import circle.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[2]
# The package the bench drives: this checkout, or a pinned copy of it (a device run that must not see a tree
# other helpers are editing meanwhile: bench/gpu/device.sh sets it)
PKG = Path(os.environ.get("VLLM_OMNI_LAUNCHER_PKG") or REPO).resolve()
GIB = 1 << 30
NOT_ON_CPU = "not measured on CPU"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vllm-omni 0.30 pipeline_wan2_2.py, with its DEBUG_PERF switch on (the device setup turns it on)
STAGE_LINE = re.compile(
    r"Pipeline stage timing summary: TextEncoding=([\d.]+) ms, LatentPreparation=([\d.]+) ms, "
    r"Denoising=([\d.]+) ms \((\d+) steps\), Decoding=([\d.]+) ms, StagesSum=[\d.]+ ms, PipelineWall=([\d.]+) ms")
MP4_LINE = re.compile(r"Video response encoding \(MP4 bytes\): ([\d.]+) ms")
ENGINE_E2E_LINE = re.compile(r"\|\s*e2e_total_ms\s*\|\s*([\d,.]+)\s*\|")   # request e2e in the engine
POSTPROCESS_LINE = re.compile(r"\|\s*postprocess_time_s\s*\|\s*([\d.]+)\s*\|")   # the stats table per job
TQDM_RATE = re.compile(r"(\d+)/(\d+) \[[^\]]*?([\d.]+)(s/it|it/s)\]")


def import_package() -> Any:
    """Import the repo (or the pinned PKG) as `vllm_omni_launcher` without installing it (the GPU box has
    no pip); a pinned PKG wins over an installed copy."""
    try:
        if os.environ.get("VLLM_OMNI_LAUNCHER_PKG"):
            raise ImportError("the pinned copy, not an installed one")
        import vllm_omni_launcher  # noqa: F401
    except ImportError:
        shim = Path("/tmp/vllm_omni_launcher_shim")
        shim.mkdir(exist_ok=True)
        link = shim / "vllm_omni_launcher"
        if link.is_symlink() and link.resolve() != PKG:   # left by an earlier device call's copy
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(PKG)
        sys.path.insert(0, str(shim))
    import vllm_omni_launcher

    return vllm_omni_launcher


def server_command(text: Optional[str]) -> list[str]:
    """The server program: `text` split like a shell would, else vLLM's CLI in this python."""
    return shlex.split(text) if text else [
        sys.executable, "-c", "import sys; from vllm.entrypoints.cli.main import main; "
                              "sys.argv[0] = 'vllm'; sys.exit(main())"]


def server_extra_env() -> dict[str, str]:
    """What the launched server needs from this shell: offline HF, the kit's PYTHONPATH and NCCL switches."""
    env = {"HF_HUB_OFFLINE": "1"}
    for key in ("PYTHONPATH", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        if os.environ.get(key):
            env[key] = os.environ[key]
    return env


def gpu_memory_mib() -> Optional[list[int]]:
    """Used MiB per GPU from nvidia-smi, or None where there is no GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()] if out.returncode == 0 else None


def gpu_processes() -> Optional[list[str]]:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


class Gpu:
    """NVML (pynvml, else nvidia-smi) sampled every 0.2 s in a thread; None everywhere on CPU."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.samples: list[tuple[float, int, int]] = []   # (t, used MiB, utilization %)
        self._stop = threading.Event()
        self._handle = None
        if self.enabled:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            except Exception:   # no usable pynvml: nvidia-smi
                self._handle = None
            threading.Thread(target=self._loop, daemon=True).start()

    def _read(self) -> tuple[int, int]:
        if self._handle is not None:
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            return int(mem.used / 2**20), int(util.gpu)
        out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        used, util = (int(x) for x in out.stdout.split(","))
        return used, util

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                used, util = self._read()
                self.samples.append((time.monotonic(), used, util))
            except Exception:
                pass
            time.sleep(0.2)

    def peak_mib(self, since: float, until: Optional[float] = None) -> Any:
        if not self.enabled:
            return NOT_ON_CPU
        window = [s[1] for s in self.samples if s[0] >= since and (until is None or s[0] <= until)]
        return max(window) if window else None

    def idle_after(self, since: float, timeout: float, util_below: int = 5, hold: int = 5) -> Any:
        """Seconds after ``since`` when utilization stayed below ``util_below`` % for ``hold`` samples."""
        if not self.enabled:
            return NOT_ON_CPU
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            window = [s for s in self.samples if s[0] >= since]
            for i in range(len(window) - hold + 1):
                if all(s[2] < util_below for s in window[i:i + hold]):
                    return round(window[i][0] - since, 2)
            time.sleep(0.2)
        return None

    def processes(self) -> Any:
        if not self.enabled:
            return NOT_ON_CPU
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]

    def close(self) -> None:
        self._stop.set()


class ServerRun:
    """One server of a bench phase, as a `with` block around its jobs. ``start()`` in the block starts the
    Supervisor and gives (supervisor, client), the ready seconds (and NVML's figure then, given ``gpu``) in the
    report entry. Leaving the block, however it ends, closes the client, stops the server (stop seconds, the GPU
    processes left after it) and copies the server log (given ``logs``). An Exception in the block, a failed
    start included, is a result rather than a crash: its text and the log's last lines go into the entry and the
    phase goes on. One copy of this so every phase's server entry keeps one shape (the copies drifted)."""

    def __init__(self, entry: dict, spec: Any, config: Any, *, gpu: Optional[Gpu] = None,
                 logs: Optional[str] = None, log_name: str = "server", save: Optional[Callable[[], None]] = None,
                 after_stop: Optional[Callable[[], None]] = None, tail_lines: int = 40, settle_s: float = 0.0):
        from vllm_omni_launcher.server.supervision.supervisor import Supervisor

        self.entry, self.spec, self.gpu = entry, spec, gpu
        self.logs, self.log_name, self.save = logs, log_name, save
        self.after_stop, self.tail_lines = after_stop, tail_lines
        self.settle_s = settle_s      # NVML lists a process a moment after it exits: wait before reading the list
        self.sup = Supervisor(spec, config)
        self.client: Any = None

    def __enter__(self) -> "ServerRun":
        return self

    def start(self, on_status: Optional[Callable[[Any], None]] = None) -> tuple[Any, Any]:
        from vllm_omni_launcher.client.api import VideoClient

        t0 = time.monotonic()
        self.sup.start(on_status=on_status)
        self.entry["ready_s"] = round(time.monotonic() - t0, 2)
        if self.gpu is not None:
            self.entry["nvml_after_ready_mib"] = self.gpu.peak_mib(time.monotonic() - 1.0)
        self.client = VideoClient(self.sup.url, api_key=self.sup.api_key, served_name=self.spec.served_name,
                                  server_version=self.sup.server_version, storage_dir=self.sup.storage_dir)
        return self.sup, self.client

    def died(self) -> bool:
        """After a job: whether the server is gone (its last lines then go into the entry), so no job follows."""
        if self.sup.alive():
            return False
        self.entry["server_died"] = self.sup.tail(30)
        return True

    def __exit__(self, exc_type: Any, exc: Optional[BaseException], tb: Any) -> bool:
        failed = isinstance(exc, Exception)     # not KeyboardInterrupt: a SIGINT still ends the phase
        if failed:   # the report says what failed, with the server's own words
            self.entry["error"] = f"{type(exc).__name__}: {exc}"[:3000]
            self.entry["log_tail"] = self.sup.tail(self.tail_lines)
        try:
            if self.client is not None:
                self.client.close()
        finally:
            t_stop = time.monotonic()
            self.sup.stop()
            self.entry["stop_s"] = round(time.monotonic() - t_stop, 2)
            if self.after_stop is not None:
                self.after_stop()
            if self.settle_s:
                time.sleep(self.settle_s)
            self.entry["gpu_processes_after_stop"] = gpu_processes()
            if self.sup.log_path and self.logs:
                Path(self.logs).mkdir(parents=True, exist_ok=True)
                shutil.copy2(self.sup.log_path, Path(self.logs) / f"{self.log_name}.log")
            if self.save is not None:
                self.save()
        return failed


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


def postprocess_s(log_text: str) -> list[float]:
    """Per job, the server's postprocess seconds (the decoded video to CPU arrays, before the MP4 encode)."""
    return [float(x) for x in POSTPROCESS_LINE.findall(_ANSI.sub("", log_text))]


def engine_e2e_s(log_text: str) -> list[float]:
    """Per job, the engine's end-to-end seconds (pipeline + postprocess; before the MP4 encode and save)."""
    return [float(x.replace(",", "")) / 1000 for x in ENGINE_E2E_LINE.findall(_ANSI.sub("", log_text))]


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


def psnr(a: Any, b: Any) -> Optional[float]:
    """PSNR (dB) of two uint8 frame stacks of one shape (inf when identical, None when either is missing or
    the shapes differ): the numeric drift of a lever against the plain run, a rough signal on random weights."""
    import math

    import numpy as np

    if a is None or b is None or a.shape != b.shape:
        return None
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return math.inf if mse == 0 else round(10 * math.log10(255.0 ** 2 / mse), 2)


def load_frames(folder: Path, prefix: str) -> Any:
    """The PNGs SaveImage wrote for `prefix` (in its counter order) as one uint8 array, None if none."""
    import numpy as np
    from PIL import Image

    files = sorted(folder.glob(f"{Path(prefix).name}_*.png"))
    return np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files]) if files else None


def save_json(path: Path, doc: Any) -> None:
    """Write atomically: a call cut at its limit leaves the last whole report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    os.replace(tmp, path)


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def machine() -> dict[str, Any]:
    """The GPU (nvidia-smi; never a CUDA context in the driver, which would count in NVML's figures) and who
    this machine is: the kernel's boot id and the GPUs' UUIDs, so `report` pairs only runs of one machine
    (device machines of one kind report the same name, memory and driver)."""
    import shutil
    import subprocess

    out: dict[str, Any] = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if BOOT_ID.exists():
        out["boot_id"] = BOOT_ID.read_text().strip()
    if shutil.which("nvidia-smi"):
        for key, query in (("gpu", "name,memory.total,driver_version"), ("gpu_uuids", "uuid")):
            q = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            out[key] = q.stdout.strip()
    return out
