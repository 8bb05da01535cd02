"""Which GPUs a server's CUDA_VISIBLE_DEVICES names, as the indices the GPU lock uses.

CUDA takes indices (`0,1`), GPU UUIDs (`GPU-5f3c...`, a unique prefix is enough) and MIG
instances (`MIG-...`), mixed in one list. The lock is per GPU index (gpu_lock.py), so UUIDs are
mapped through NVML (nvidia-ml-py, imported lazily, as planner/gpus.py does for listing GPUs;
this layer cannot import the planner) and a MIG instance locks its whole GPU. Without NVML a
UUID cannot be mapped: the server then claims all visible GPUs, which conflicts with every
other claim and so never lets two servers share a GPU. A name NVML does not know is refused
with our message (CUDA would silently stop its list there and the server would see fewer GPUs).
NVML numbers GPUs in PCI bus order; CUDA does too under CUDA_DEVICE_ORDER=PCI_BUS_ID and, on a
machine of identical GPUs, by default.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from ...errors import LauncherError

Gpus = Optional[tuple[int, ...]]      # None: every GPU the server can see
UuidIndex = Callable[[], Optional[Mapping[str, int]]]    # UUID (GPU or MIG) -> GPU index; None: no NVML


def nvml_uuids(nvml: Any = None) -> Optional[dict[str, int]]:
    """Every GPU's UUID (and its MIG instances') -> its index; None when NVML cannot be used."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[import-not-found]  # nvidia-ml-py
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no package, no driver, no GPU: nothing can be mapped
        return None
    out: dict[str, int] = {}
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            out[_text(nvml.nvmlDeviceGetUUID(handle))] = index
            for mig in _mig_handles(nvml, handle):
                out[_text(nvml.nvmlDeviceGetUUID(mig))] = index
    except Exception:  # noqa: BLE001 - a driver error halfway: what was read is still right
        pass
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


def _mig_handles(nvml: Any, handle: Any) -> list[Any]:
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except Exception:  # noqa: BLE001 - not a MIG-capable GPU
        return []
    found = []
    for i in range(count):
        try:
            found.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        except Exception:  # noqa: BLE001 - an empty MIG slot
            continue
    return found


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def visible_gpus(value: str, uuid_index: UuidIndex = nvml_uuids) -> Gpus:
    """The GPU indices CUDA_VISIBLE_DEVICES=`value` names; None for all (unset, or a UUID
    without NVML). Raises LauncherError (setting gpus) for a name that is no GPU here."""
    parts = [p for p in value.replace(" ", "").split(",") if p]
    if not parts:
        return None
    known: Optional[Mapping[str, int]] = None
    found: set[int] = set()
    for part in parts:
        if part.isdigit():
            found.add(int(part))
            continue
        if known is None:
            known = uuid_index()
            if known is None:
                return None          # cannot map without NVML: claim all, which excludes every other claim
        matches = {index for uuid, index in known.items() if uuid.startswith(_legacy_mig(part))}
        if len(matches) != 1:
            raise _unmapped(value, part, "no GPU of this machine has that UUID" if not matches
                            else "that prefix matches several GPUs")
        found |= matches
    return tuple(sorted(found))


def _legacy_mig(part: str) -> str:
    """`MIG-GPU-<uuid>/<gi>/<ci>` (drivers before R470) names the GPU: map it as that GPU."""
    return part[4:].split("/")[0] if part.startswith("MIG-GPU-") else part


def _unmapped(value: str, part: str, why: str) -> LauncherError:
    return LauncherError(
        f"The server's CUDA_VISIBLE_DEVICES={value} names '{part}', which the GPU lock cannot map to a GPU",
        f"{why} (`nvidia-smi -L` lists the GPUs and their UUIDs); CUDA would stop its list there and the "
        "server would see fewer GPUs than meant", "select the GPUs by index in gpus (Serving Config, --gpus), or "
        "correct CUDA_VISIBLE_DEVICES in ComfyUI's environment or extra_env", setting="gpus", kind="config")
