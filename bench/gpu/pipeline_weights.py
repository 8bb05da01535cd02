"""Random real-size weights of one issue-30 pipeline, in its repo's layout, from its manifest (pipeline_manifest.py).

`build` (device, image python: torch + safetensors only) writes `<base>/models/diffusers/<pipeline>-fullsize/`:
the small files verbatim, every part filled with seeded random values (weights.Filler: on the GPU when there is
one) as safetensors (sharded like save_pretrained: 5 GB, or the repo's own shard count) or as a torch.save .pth
(S2V's T5 and VAE); S2V's `outside` files (an HF cache holding the Wan2.1 VAE config diffusers' single-file loader
asks for) go under `<base>/`. The Diffusers pipelines' text encoder (UMT5-XXL, 10.6 GiB) is one file,
`<base>/models/shared/umt5-xxl-bf16.safetensors`, hard-linked into each folder, so it is written once per machine
and survives `remove` of a pipeline (the last one out removes it with `shared=True`). Nothing is written when the
disk lacks room (the plan says what each part takes and what is free). Random weights: speed and memory only.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from .families import GIB, MARGIN
from .pipeline_families import Pipeline
from .weights import SHARD_BYTES, Filler, _write_file, _write_sharded, nbytes

SHARED = ("shared", "umt5-xxl-bf16.safetensors")     # under <base>/models


def model_dir(base: Path, p: Pipeline) -> Path:
    return base / "models" / "diffusers" / p.folder


def shared_path(base: Path) -> Path:
    return base.joinpath("models", *SHARED)


def part_bytes(manifest: dict) -> dict[str, int]:
    return {part["name"]: nbytes(part["tensors"]) for part in manifest["parts"]}


def footprint_gib(manifest: dict) -> tuple[float, float]:
    """(GiB of the pipeline's own files, GiB of the shared text encoder it links), for disk_order."""
    own = sum(nbytes(part["tensors"]) for part in manifest["parts"] if not part.get("shared"))
    shared = sum(nbytes(part["tensors"]) for part in manifest["parts"] if part.get("shared"))
    return own / GIB, shared / GIB


def plan(manifest: dict, base: Path, p: Pipeline, reserve: int = 0) -> dict[str, Any]:
    """Bytes this build writes (a shared part already on disk counts nothing) against the free disk."""
    sizes = part_bytes(manifest)
    have_shared = shared_path(base).is_file()
    write = sum(b for part, b in zip(manifest["parts"], sizes.values())
                if not (part.get("shared") and have_shared))
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    out = {"pipeline": p.name, "gib": {k: round(v / GIB, 2) for k, v in sizes.items()},
           "write_gib": round(write / GIB, 2), "shared_on_disk": have_shared, "disk_free_gib": round(free / GIB, 1)}
    if write + MARGIN + reserve > free:
        out["short"] = (f"{base}: needs {write / GIB:.1f} GiB + {MARGIN / GIB:.0f} GiB margin + "
                        f"{reserve / GIB:.0f} GiB kept, {free / GIB:.1f} GiB free")
    return out


def _write_pth(filler: Filler, tensors: list, path: Path) -> int:
    """A torch.save'd state dict, as Wan ships its T5 encoder and VAE (loaded with weights_only=True)."""
    import torch

    shapes = {k: s for k, s, _ in tensors}
    data = {k: filler.make(k, s, d, shapes) for k, s, d in tensors}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    torch.save(data, str(tmp))
    os.replace(tmp, path)
    return sum(v.numel() * v.element_size() for v in data.values())


def even_shards(tensors: list, count: int) -> list[list]:
    """`count` consecutive groups of about equal bytes (the repo's own shard count: S2V ships 4 files)."""
    total, groups, seen = nbytes(tensors), [[] for _ in range(count)], 0
    for t in tensors:
        groups[min(count - 1, seen * count // max(1, total))].append(t)
        seen += nbytes([t])
    return [g for g in groups if g]


def _write_part(filler: Filler, part: dict, out: Path, shard_bytes: int) -> int:
    if part["format"] == "pth":
        return _write_pth(filler, part["tensors"], out / part["path"])
    folder, stem = (out / part["path"]).parent, Path(part["path"]).name
    folder.mkdir(parents=True, exist_ok=True)
    groups = even_shards(part["tensors"], part["shards"]) if part.get("shards") else None
    return _write_sharded(filler, part["tensors"], folder, stem, shard_bytes, groups)


def build(manifest: dict, base: Path, p: Pipeline, seed: int = 0, shard_bytes: int = SHARD_BYTES,
          reserve: int = 0, log: Any = print) -> dict:
    """Write the pipeline's folder (and its `outside` files under `base`); stop before writing anything when the
    disk lacks room."""
    if manifest.get("pipeline") != p.name:
        raise SystemExit(f"the manifest is {manifest.get('pipeline')}'s, not {p.name}'s")
    report: dict[str, Any] = {"plan": plan(manifest, base, p, reserve), "files": {}}
    log("pipeline weights: plan " + json.dumps(report["plan"]))
    if report["plan"].get("short"):
        raise SystemExit("pipeline weights: not enough room, nothing written: " + report["plan"]["short"] +
                         ". Remove the last pipeline's weights first (`pipeline-weights --remove`)")
    t0 = time.monotonic()
    filler = Filler(seed)
    out = model_dir(base, p)
    for root, files in ((out, manifest["files"]), (base, manifest.get("outside", {}))):
        for rel, spec in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(base64.b64decode(spec["b64"]))
    for part in manifest["parts"]:
        if part.get("shared"):      # one file for every Diffusers pipeline, hard-linked into the folder
            shared, link = shared_path(base), out / f"{part['path']}.safetensors"
            if not shared.is_file():
                shared.parent.mkdir(parents=True, exist_ok=True)
                size = _write_file(filler, part["tensors"], shared)
                report["files"][f"{part['name']} (shared, written)"] = round(size / GIB, 3)
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.exists():
                link.unlink()
            os.link(shared, link)
            log(f"pipeline weights: {part['name']} linked at {time.monotonic() - t0:.0f}s")
            continue
        size = _write_part(filler, part, out, shard_bytes)
        report["files"][part["name"]] = round(size / GIB, 3)
        log(f"pipeline weights: {part['name']} {size / GIB:.2f} GiB at {time.monotonic() - t0:.0f}s")
    report["seconds"] = round(time.monotonic() - t0, 1)
    (out / ".built").write_text(json.dumps(report))
    return report


def remove(base: Path, p: Pipeline, shared: bool = False) -> dict:
    """Delete the pipeline's folder (and the shared text encoder with `shared`): the room the next one needs."""
    before = shutil.disk_usage(base).free if base.exists() else 0
    shutil.rmtree(model_dir(base, p), ignore_errors=True)
    if shared and shared_path(base).exists():
        shared_path(base).unlink()
    return {"removed": p.name, "shared_removed": shared,
            "freed_gib": round((shutil.disk_usage(base).free - before) / GIB, 1) if base.exists() else 0.0}

