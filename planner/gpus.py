"""What GPUs this machine has, from NVML (nvidia-ml-py, imported lazily), or hypothetical ones.

Every function takes an optional `nvml` module so tests can pass a fake that stands in for
the GPU; without one, `pynvml` (shipped by nvidia-ml-py) is imported on first use. No GPU, no
driver or no package is not an error here: the caller gets an empty list and the reason
(`scan_gpus` also says whether that means "no NVIDIA GPU here" or only "could not tell").

`select_gpus` turns the gpus setting (auto / all / ids / count=N) into ids; a workflow can
send any count, so it is capped (`MAX_GPUS`) before a list is built.
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Optional, Sequence

from ..errors import SpecError
from ..server.config.config_values import shown
from ..server.launch.spec import MAX_GPUS, parse_gpus

GIB = 1024 ** 3
# NVML's own codes for "no NVIDIA driver here" (NVML_ERROR_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED):
# unlike a permission or an unknown error, they mean this machine has no GPU a server could use.
_NO_DRIVER_CODES = (12, 9)

# Marketing "GB" of GPU cards is GiB in practice (an "80 GB" H100 shows 81,559 MiB, a
# "24 GB" 4090 24,564 MiB), so hypothetical GPUs given as `--gpu-memory 24,24` are GiB.
# No GPU comes near this size (the largest in 2026 hold under 300 GiB): a size above it is a
# typo ("80000" for 80) or a hostile value, refused like NaN and infinity.
MAX_GPU_GIB = 4096.0


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the planner sees it (memory in GiB)."""

    index: int
    name: str
    total_gib: float
    free_gib: Optional[float] = None     # None: hypothetical card, plan against total
    driver: Optional[str] = None
    compute_capability: Optional[tuple[int, int]] = None
    uuid: Optional[str] = None
    hypothetical: bool = False

    @property
    def is_geforce(self) -> bool:
        """Consumer cards: no GPUDirect peer-to-peer (NVIDIA/nccl #1309), slow all-to-all."""
        n = self.name.lower()
        return "geforce" in n or " rtx 30" in n or " rtx 40" in n or " rtx 50" in n or n.startswith("rtx 40") \
            or n.startswith("rtx 50") or n.startswith("rtx 30")

    @property
    def available_gib(self) -> float:
        return self.total_gib if self.free_gib is None else self.free_gib

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute_capability"] = (f"{self.compute_capability[0]}.{self.compute_capability[1]}"
                                      if self.compute_capability else None)
        data["is_geforce"] = self.is_geforce
        return data


def hypothetical_gpus(memory_gib: Sequence[float], name: str = "") -> list[GpuInfo]:
    """GPUs that are not present (e.g. planning for 2 x 24 GiB from a laptop)."""
    out = []
    for i, gib in enumerate(memory_gib):
        label = name or f"{gib:g} GiB GPU (hypothetical)"
        out.append(GpuInfo(index=i, name=label, total_gib=float(gib), hypothetical=True))
    return out


def parse_gpu_memory(text: str) -> list[float]:
    """'24,24' -> [24.0, 24.0]; '2x80' -> [80.0, 80.0]; '141' -> [141.0] (GiB).

    Every size is a finite number above 0 and at most MAX_GPU_GIB, and every comma separates
    two sizes: '24,' is refused rather than read as one GPU, NaN rather than compared as false."""
    example = "write sizes in GiB separated by commas, e.g. 24,24 or 80 or 2x141"
    parts = text.replace(" ", "").lower().split(",")
    if parts == [""]:
        raise ValueError(f"no GPU memory sizes given: {example}")
    out: list[float] = []
    for part in parts:
        if not part:
            raise ValueError(f"{shown(text)} has an empty size between commas: {example}")
        head, times, size = part.rpartition("x")
        try:
            count = int(head) if times else 1
            value = float(size.removesuffix("gib").removesuffix("gb"))
        except ValueError:
            raise ValueError(f"{shown(part)} is not a size: {example}") from None
        if not (math.isfinite(value) and 0 < value <= MAX_GPU_GIB) or count < 1:
            raise ValueError(f"{shown(part)} is not a GPU size: each must be a number above 0 and at most "
                             f"{MAX_GPU_GIB:g} GiB, with a count of at least 1 ({example})")
        if count > MAX_GPUS or len(out) + count > MAX_GPUS:
            raise ValueError(f"{shown(text)} lists more than {MAX_GPUS} GPUs; write one size per GPU "
                             "of one machine, e.g. 2x80")
        out += [value] * count
    return out


def load_nvml(nvml: Any = None) -> tuple[Any, Optional[str]]:
    """(initialised NVML module, None) or (None, reason it could not be used)."""
    mod, reason, _absent = open_nvml(nvml)
    return mod, reason


def open_nvml(nvml: Any = None) -> tuple[Any, Optional[str], bool]:
    """load_nvml, and whether the failure means there is no NVIDIA driver (so no usable GPU)."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[import-not-found]  # nvidia-ml-py
        except ImportError:
            return None, ("nvidia-ml-py is not installed (pip install nvidia-ml-py), so GPUs could not be "
                          "listed"), False
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        absent = getattr(exc, "value", None) in _NO_DRIVER_CODES
        return None, f"NVML could not start ({_nvml_text(exc)}): no NVIDIA driver or no GPU on this machine", absent
    return nvml, None, False


def _nvml_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.decode() if isinstance(text, bytes) else text


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_indices(count: int) -> list[int]:
    """NVML indices this process's CUDA_VISIBLE_DEVICES selects (all when unset or not numeric)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None or env.strip() == "":
        return list(range(count)) if env is None else []
    out = []
    for part in env.split(","):
        part = part.strip()
        if not part.isdigit():
            return list(range(count))    # UUID / MIG names: do not guess
        if int(part) < count:
            out.append(int(part))
    return out


@dataclass(frozen=True)
class GpuScan:
    """What NVML said about this machine's GPUs."""

    gpus: list[GpuInfo]
    reason: Optional[str]          # why the list is empty (None when it is not)
    absent: bool = False           # NVML says there is no NVIDIA GPU (no driver, or none found), not "unknown"


def query_gpus(nvml: Any = None, *, shutdown: bool = True) -> tuple[list[GpuInfo], Optional[str]]:
    """The machine's GPUs (all of them, NVML order) and None, or [] and the reason."""
    found = scan_gpus(nvml, shutdown=shutdown)
    return found.gpus, found.reason


def scan_gpus(nvml: Any = None, *, shutdown: bool = True) -> GpuScan:
    """query_gpus, saying whether an empty answer means "no NVIDIA GPU here"."""
    mod, reason, absent = open_nvml(nvml)
    if mod is None:
        return GpuScan([], reason, absent)
    gpus, reason = _list_gpus(mod, shutdown)
    return GpuScan(gpus, reason, reason == NONE_FOUND)


NONE_FOUND = "NVML found no GPU"


def _list_gpus(mod: Any, shutdown: bool) -> tuple[list[GpuInfo], Optional[str]]:
    try:
        count = mod.nvmlDeviceGetCount()
        try:
            driver: Optional[str] = _s(mod.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        gpus = []
        for i in range(count):
            h = mod.nvmlDeviceGetHandleByIndex(i)
            mem = mod.nvmlDeviceGetMemoryInfo(h)
            try:
                cc: Optional[tuple[int, int]] = tuple(mod.nvmlDeviceGetCudaComputeCapability(h))  # type: ignore[assignment]
            except Exception:
                cc = None
            try:
                uuid: Optional[str] = _s(mod.nvmlDeviceGetUUID(h))
            except Exception:
                uuid = None
            gpus.append(GpuInfo(index=i, name=_s(mod.nvmlDeviceGetName(h)), total_gib=mem.total / GIB,
                                free_gib=mem.free / GIB, driver=driver, compute_capability=cc, uuid=uuid))
        if not gpus:
            return [], NONE_FOUND
        return gpus, None
    except Exception as exc:
        return [], f"NVML failed while listing GPUs ({_nvml_text(exc)})"
    finally:
        if shutdown:
            try:
                mod.nvmlShutdown()
            except Exception:
                pass


def _const(nvml: Any, name: str, default: int) -> int:
    """An NVML constant; nvidia-ml-py 13 defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,)."""
    value = getattr(nvml, name, default)
    return int(value[0]) if isinstance(value, tuple) else int(value)


_TOPO = {0: "same GPU", 10: "one PCIe switch (PIX)", 20: "several PCIe switches (PXB)",
         30: "one CPU's PCIe host bridge (PHB)", 40: "the same NUMA node (NODE)",
         50: "across CPU sockets (SYS)"}


def peer_status(nvml: Any, gpus: Sequence[GpuInfo]) -> list[dict[str, Any]]:
    """P2P and topology for each GPU pair, from an initialised NVML module.

    Each entry: {"pair": (a, b), "p2p_read": "ok"|"not supported"|"unknown", "nvlink": bool|None,
    "topology": text}.
    """
    out = []
    handles = {g.index: nvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus}
    for ai, a in enumerate(gpus):
        for b in gpus[ai + 1:]:
            ha, hb = handles[a.index], handles[b.index]
            entry: dict[str, Any] = {"pair": [a.index, b.index], "p2p_read": "unknown", "nvlink": None,
                                     "topology": "unknown"}
            try:
                cap = _const(nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
                status = nvml.nvmlDeviceGetP2PStatus(ha, hb, cap)
                ok = _const(nvml, "NVML_P2P_STATUS_OK", 0)
                entry["p2p_read"] = "ok" if status == ok else "not supported"
            except Exception as exc:
                entry["p2p_read"] = f"unknown ({_nvml_text(exc)})"
            try:
                cap = _const(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
                status = nvml.nvmlDeviceGetP2PStatus(ha, hb, cap)
                entry["nvlink"] = status == _const(nvml, "NVML_P2P_STATUS_OK", 0)
            except Exception:
                pass
            try:
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb))
                entry["topology"] = _TOPO.get(level, f"level {level}")
            except Exception as exc:
                entry["topology"] = f"unknown ({_nvml_text(exc)})"
            if entry["nvlink"]:
                entry["topology"] = "NVLink"
            out.append(entry)
    return out


def processes_on_gpus(nvml: Any, gpus: Sequence[GpuInfo]) -> dict[int, list[dict[str, Any]]]:
    """{gpu index: [{"pid", "used_gib"}]} for compute processes (what NVML lets this user see)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for g in gpus:
        h = nvml.nvmlDeviceGetHandleByIndex(g.index)
        procs = []
        getter = getattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None) or \
            getattr(nvml, "nvmlDeviceGetComputeRunningProcesses")
        for p in getter(h) or []:
            used = getattr(p, "usedGpuMemory", None)
            procs.append({"pid": int(p.pid), "used_gib": (used / GIB) if isinstance(used, int) else None})
        out[g.index] = procs
    return out


def select_gpus(text: str, visible: list[int]) -> Optional[tuple[int, ...]]:
    """auto / all / '' -> None (every visible GPU); '0,1' -> (0, 1); count=N -> the first N visible.

    N is checked (a whole number, 1..MAX_GPUS) before any list is built: a workflow may send
    count=1000000000, and where no GPU is visible the ids would otherwise be made up to N."""
    text = text.strip().lower()
    if not text.startswith("count="):
        return parse_gpus(text)
    try:
        count = int(text.split("=", 1)[1])
    except ValueError as exc:
        raise SpecError(f"gpus got {shown(text)}, whose count is not a number", "expected count=N",
                        "write e.g. count=2", setting="gpus") from exc
    if not 1 <= count <= MAX_GPUS:             # the count as the workflow wrote it, cut: it may have 4000 digits
        raise SpecError(f"gpus got {shown(text)}, a GPU count out of range",
                        f"count=N takes 1 to {MAX_GPUS} GPUs of this machine",
                        "write e.g. count=2, or all", setting="gpus")
    ids = visible or list(range(count))
    if count > len(ids):
        raise SpecError(f"{count} GPUs requested, {len(ids)} visible", "count=N takes the first N visible GPUs",
                        f"use count={len(ids)} or fewer", setting="gpus")
    return tuple(ids[:count])
