"""LoRA .safetensors files: reading their header, and a scaled copy for fused strengths other than 1.

Why a copy: vLLM-Omni 0.30 fuses a single-file LoRA at startup (`--lora-backend distill`) at the
file's own scale. Checked in the 0.30 wheel: `WanLoraLoaderMixin.load_lora_weights`
(`diffusion/lora/loader.py`) converts ComfyUI keys with diffusers'
`_convert_non_diffusers_wan_lora_to_diffusers`, which folds `alpha / rank` into the block
matrices (and ignores alpha elsewhere), then `_prepare_lora_delta` adds `B @ A` to each weight
and a `diff_b` / `lora_B.bias` as it is; `--lora-scale` is not read on that path. So strength S
is served by fusing a copy whose "up" side is multiplied by S: every `lora_up.weight` /
`lora_B.weight` and every direct delta (`.diff`, `.diff_b`, `lora_B.bias`). Down matrices and
alpha stay as they are, so the converter's alpha/rank still applies and each fused delta is
exactly S times the original's (up to the file's own precision for S not a power of two). That
works for ComfyUI and Diffusers keys alike, unlike rewriting alpha, which the converter honours
only for the block linears.

The copy lives in the launcher's data dir (`loras/`, never ComfyUI's loras folder), named by
the source's identity (a hash of its header, size and mtime) and the strength, so the same
choice reuses it and a changed source or strength makes a new one (and, being a new
--lora-path, a new server fingerprint). It is written to a temporary name and renamed
(atomic), private like everything under the data dir (0600 in a 0700 folder: the server runs
as the same user; a link planted in its place is refused, never followed: private_files.py).
The newest `KEEP` copies are kept; older ones are removed when a new one is made, and reusing
one marks it new again. A copy a server of ours uses is never removed, however
old: the supervisor restarts a crashed server from its spec (the same --lora-path), not through
this module, so an evicted copy would turn a crash into a failed restart. Which copies are in
use (`copies_in_use`): the specs in the state files (every running server of every launcher
process on this data dir) and the specs of this process's supervisors (a server the supervisor
is restarting has no state file until it is back; one that stopped for good is started again
through `scaled_lora`, which makes its copy again). This module cannot ask the registry for the
supervisors (registry -> supervisor -> spec -> loras -> here would be a circle), so the registry
hands them in the other way: it registers a source of in-use paths (`add_in_use_source`) when it
is imported, and every supervisor of this process is in a registry that was imported.

The file format (safetensors): an 8-byte little-endian header length, a JSON header
(`{name: {"dtype", "shape", "data_offsets": [begin, end]}}`, offsets relative to the data
after the header, plus an optional `__metadata__` of strings), then the raw little-endian data.
Scaling uses numpy (a dependency of the launcher); bf16, which numpy lacks, is widened to
float32 through its bit pattern and rounded back to nearest-even.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ...errors import LauncherError
from ..storage import state_file
from ..storage.private_files import existing_file, private_dir, replacing

SCALED_SUFFIXES = (".lora_up.weight", ".lora_B.weight", ".lora_B.bias", ".diff", ".diff_b")
SCALABLE_DTYPES = ("F64", "F32", "F16", "BF16")
FOLDER = "loras"
KEEP = 4
MAX_HEADER = 100 * 2**20
_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}

InUseSource = Callable[[], Iterable[str]]
_in_use_sources: list[InUseSource] = []        # registry.py's: this process's supervisors' LoRA paths


def add_in_use_source(source: InUseSource) -> None:
    """Count the startup LoRA paths `source()` names as in use from now on (copies_in_use).
    The registry registers its supervisors' here: it imports this module, never the reverse."""
    if source not in _in_use_sources:
        _in_use_sources.append(source)


@dataclass(frozen=True)
class SafetensorsHeader:
    """A safetensors file's header: its tensors, its metadata, and where the data starts."""

    tensors: dict[str, dict[str, Any]]
    metadata: dict[str, str]
    data_start: int
    digest: str                      # sha256 of the header bytes


def read_header(path: Path) -> SafetensorsHeader:
    """The header of the safetensors file `path`; LauncherError (naming the LoRA widget) when it is not one."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= MAX_HEADER:
                raise ValueError("its header length is not plausible")
            raw = f.read(size)
        parsed = json.loads(raw)
        if not isinstance(parsed, dict):
            raise ValueError("its header is not a JSON object")
    except (OSError, ValueError) as exc:
        raise LauncherError(f"{path.name} is not a safetensors file", str(exc), "pick another LoRA",
                            setting="lora_name") from exc
    metadata = parsed.pop("__metadata__", None) or {}
    return SafetensorsHeader(parsed, dict(metadata), 8 + size, hashlib.sha256(raw).hexdigest())


def unscalable(header: SafetensorsHeader) -> str:
    """Why this LoRA cannot be fused at another strength ("" when it can)."""
    scaled = [(name, info.get("dtype")) for name, info in header.tensors.items() if name.endswith(SCALED_SUFFIXES)]
    if not scaled:
        return "it has no up (lora_up / lora_B) weights or deltas to scale"
    odd = sorted({str(dtype) for _, dtype in scaled if dtype not in SCALABLE_DTYPES})
    if odd:
        return f"its up weights are {', '.join(odd)}; the launcher scales only {', '.join(SCALABLE_DTYPES)}"
    return ""


def scaled_lora(source: Path, strength: float, data_dir: str) -> Path:
    """The copy of `source` to fuse for `strength` (callers fuse the file itself at 1.0), in the
    data dir: made now unless it exists. Raises LauncherError naming `strength`."""
    header = read_header(source)
    why = unscalable(header)
    if why:
        raise LauncherError(f"LoRA '{source.name}' cannot be fused at strength {strength:g}", why,
                            "set strength to 1.0, or use a bf16 / fp16 / fp32 LoRA file, or a PEFT folder "
                            "(applied per request at any strength)", setting="strength")
    folder = private_dir(data_dir, FOLDER)
    stat = source.stat()
    identity = hashlib.sha256(f"{header.digest}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = folder / f"{source.stem}-{identity}-x{strength:g}.safetensors"
    if existing_file(target):        # a link planted there is refused, never followed
        os.utime(target)             # reused: newest again, so eviction keeps it
    else:
        _write_scaled(source, header, strength, target)
    _evict(folder, keep={target.resolve(), *copies_in_use(data_dir)})
    return target


def copies_in_use(data_dir: str) -> set[Path]:
    """The startup LoRA files of the servers of ours: those in the state files under `data_dir`
    and those the registered sources name (this process's supervisors: see the module docstring)."""
    specs = [st.spec for _, st in state_file.read_all(data_dir) if st is not None]
    paths = {p for spec in specs for p in (spec.get("lora") or {}).get("lora_paths", ())}
    for source in list(_in_use_sources):
        paths.update(source())
    return {Path(p).resolve() for p in paths if isinstance(p, str)}


def _write_scaled(source: Path, header: SafetensorsHeader, strength: float, target: Path) -> None:
    """Write `source` with its up weights and deltas times `strength` to `target`, atomically."""
    metadata = {**header.metadata, "vllm_omni_launcher.source": source.name,
                "vllm_omni_launcher.strength": f"{strength:g}"}
    blob = json.dumps({"__metadata__": metadata, **header.tensors}, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)                      # the data starts 8-byte aligned, as safetensors writes it
    with open(source, "rb") as src, replacing(target, sync=True) as out:
        out.write(len(blob).to_bytes(8, "little") + blob)
        for name, info in sorted(header.tensors.items(), key=lambda item: item[1]["data_offsets"][0]):
            begin, end = info["data_offsets"]
            src.seek(header.data_start + begin)
            data = src.read(end - begin)
            if len(data) != end - begin:
                raise LauncherError(f"LoRA '{source.name}' is truncated", f"tensor {name} ends past the file",
                                    "download the LoRA again", setting="lora_name")
            out.write(_scale(data, info["dtype"], strength) if name.endswith(SCALED_SUFFIXES) else data)


def _scale(data: bytes, dtype: str, strength: float) -> bytes:
    """`data` (little-endian `dtype` values) times `strength`, in the same dtype."""
    import numpy as np

    if dtype in _NUMPY_DTYPES:
        values = np.frombuffer(data, dtype=_NUMPY_DTYPES[dtype])
        return (values.astype(np.float64) * strength).astype(values.dtype).tobytes()
    bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16          # bf16 -> float32 bit pattern
    scaled = (bits.view(np.float32) * np.float32(strength)).view(np.uint32)
    rounded = (scaled + 0x7FFF + ((scaled >> 16) & 1)) >> 16                  # round to nearest even
    return rounded.astype("<u2").tobytes()


def _evict(folder: Path, keep: set[Path]) -> None:
    """Remove all but the newest `KEEP` scaled copies, never one in `keep` (the one just asked
    for, those servers use): those count towards the `KEEP`, and may exceed it."""
    copies = sorted(folder.glob("*.safetensors"), key=lambda p: p.lstat().st_mtime_ns, reverse=True)
    kept = {p for p in copies if p.resolve() in keep}
    for old in [p for p in copies if p not in kept][max(0, KEEP - len(kept)):]:
        old.unlink(missing_ok=True)
