"""The one stand-in for `pynvml` (nvidia-ml-py) that unit tests use: the GPU is what it fakes.

Tests pass a FakeNvml where the planner takes an `nvml` module, or install it as
``sys.modules["pynvml"]``. It answers like the real module: the same function names and
parameters, the same constants, real ``pynvml.NVMLError`` exceptions (``value`` is NVML's code,
``str()`` its text) and real pynvml result types (``c_nvmlMemory_t``, the friendly object of
``c_nvmlProcessInfo_v3_t``), and NVML's init count (calls outside nvmlInit/nvmlShutdown fail
with "Uninitialized", as they do on a real machine). tests/unit/test_fake_nvml_matches_pynvml.py
checks every NVML name here against the installed pynvml, so the fake cannot drift from it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import pynvml

GIB = 1024 ** 3

# Constants the launcher reads, with nvidia-ml-py's values (13 defines the READ index as the tuple (0,)).
NVML_P2P_CAPS_INDEX_READ = (0,)
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_P2P_STATUS_DISABLED_BY_REGKEY = 4
NVML_TOPOLOGY_SYSTEM = 50
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_UNKNOWN = 999


@dataclass(frozen=True)
class FakeGpu:
    """One GPU as NVML reports it. `migs`: None for a GPU without MIG, else its MIG slots in order
    (a UUID, or None for an empty slot); `processes`: (pid, GiB used) of its compute processes."""

    name: str = "NVIDIA H100 80GB HBM3"
    total_gib: float = 80.0
    free_gib: Optional[float] = None          # None: all of it free
    cc: tuple[int, int] = (9, 0)
    uuid: Optional[str] = None                # None: GPU-<index>
    migs: Optional[Sequence[Optional[str]]] = None
    processes: Sequence[tuple[int, float]] = field(default_factory=tuple)


@dataclass(frozen=True)
class _Handle:
    """An opaque device handle, as pynvml's c_nvmlDevice_t pointer is to its callers."""

    index: int
    mig: Optional[int] = None


class FakeNvml:
    """NVML of a machine with these GPUs (none: NVML runs and lists none), or one whose nvmlInit
    fails with NVML code `init_error` (12 no library, 9 no driver, 4 no permission, 999 unknown)."""

    NVMLError = pynvml.NVMLError
    NVML_P2P_CAPS_INDEX_READ = NVML_P2P_CAPS_INDEX_READ
    NVML_P2P_CAPS_INDEX_NVLINK = NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK = NVML_P2P_STATUS_OK

    def __init__(self, gpus: Sequence[FakeGpu] = (), *, init_error: Optional[int] = None,
                 driver: str = "580.65.06", p2p_read_ok: bool = False, nvlink: bool = False,
                 topology: int = NVML_TOPOLOGY_SYSTEM) -> None:
        self.gpus, self.init_error, self.driver = list(gpus), init_error, driver
        self.p2p_read_ok, self.nvlink, self.topology = p2p_read_ok, nvlink, topology
        self.inits = 0          # NVML's reference count: nvmlInit adds one, nvmlShutdown takes one
        self.shutdowns = 0

    # ---- state ----------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self._started()
        self.inits -= 1
        self.shutdowns += 1

    def _started(self) -> None:
        if self.inits <= 0:
            raise pynvml.NVMLError(NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: _Handle) -> FakeGpu:
        self._started()
        if not isinstance(handle, _Handle) or handle.mig is not None:
            raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[handle.index]

    # ---- system and devices ---------------------------------------------------------------------
    def nvmlSystemGetDriverVersion(self) -> str:
        self._started()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._started()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._started()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        gpu = self._gpu(_Handle(handle.index))        # a MIG instance's handle names its GPU and slot
        if handle.mig is not None:
            return str(gpu.migs[handle.mig])      # type: ignore[index]
        return gpu.uuid or f"GPU-{handle.index}"

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Optional[int] = None) -> pynvml.c_nvmlMemory_t:
        gpu = self._gpu(handle)
        total = int(gpu.total_gib * GIB)
        free = total if gpu.free_gib is None else int(gpu.free_gib * GIB)
        return pynvml.c_nvmlMemory_t(total=total, free=free, used=total - free)

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._gpu(handle).cc

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: _Handle) -> list:
        return [pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=int(gib * GIB)))
                for pid, gib in self._gpu(handle).processes]

    # ---- pairs ----------------------------------------------------------------------------------
    def nvmlDeviceGetP2PStatus(self, device1: _Handle, device2: _Handle, p2pIndex: int) -> int:
        self._gpu(device1), self._gpu(device2)
        if not isinstance(p2pIndex, int):       # ctypes refuses the tuple nvidia-ml-py 13 names READ with
            raise TypeError(f"an integer is required (got type {type(p2pIndex).__name__})")
        if p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK:
            return NVML_P2P_STATUS_OK if self.nvlink else NVML_P2P_STATUS_DISABLED_BY_REGKEY
        return NVML_P2P_STATUS_OK if self.p2p_read_ok else NVML_P2P_STATUS_GPU_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: _Handle, device2: _Handle) -> int:
        self._gpu(device1), self._gpu(device2)
        return self.topology

    # ---- MIG ------------------------------------------------------------------------------------
    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        gpu = self._gpu(device)
        if gpu.migs is None:
            raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return len(gpu.migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _Handle:
        gpu = self._gpu(device)
        if gpu.migs is None:
            raise pynvml.NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= index < len(gpu.migs) or gpu.migs[index] is None:
            raise pynvml.NVMLError(NVML_ERROR_NOT_FOUND)          # an empty slot
        return _Handle(device.index, index)


def broken_nvml() -> FakeNvml:
    """NVML whose start fails without saying there is no GPU (NVML_ERROR_UNKNOWN): the planner and the
    doctor learn nothing about the GPUs and must say so, not take the machine for a GPU-less one."""
    return FakeNvml(init_error=NVML_ERROR_UNKNOWN)
