"""`python -m bench.gpu <phase> ...`, from the repository root.

  manifest   (CPU) tensor names/shapes of both sides from the upstream classes -> bench/gpu/manifest_ti2v5b.json
  weights    (device, image python) random real-size weights: ComfyUI single files + our Diffusers folder
  detect     (ComfyUI's python) what ComfyUI's model detection makes of each single file
  native     (ComfyUI's python) issue 26 section 1: ComfyUI's native Wan2.2 5B workflow and our template
             in one ComfyUI, same request, per-side timings, NVML peak, host RAM
  calibrate  (server venv python) issue 25: memory + speed per offload/tiling config and shape through our
             Supervisor and client, NVML peak per job; --caps runs jobs under the allocator cap
  report     (any python) the markdown tables of a results folder
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _manifest(a: argparse.Namespace) -> int:
    from . import weights

    doc = weights.write_manifest(a.side, Path(a.source), Path(a.out), full_size=not a.tiny)
    print(f"{a.out}: sides {sorted(doc)}")
    return 0


def _weights(a: argparse.Namespace) -> int:
    from . import weights

    manifest = json.loads(Path(a.manifest).read_text())
    report = weights.build(manifest, Path(a.base), seed=a.seed, shard_bytes=int(a.shard_gb * 1e9))
    print("WEIGHTS " + json.dumps(report), flush=True)
    return 0


def _detect(a: argparse.Namespace) -> int:
    from . import weights

    result = weights.detect(Path(a.base), Path(a.comfy_dir), cpu=a.cpu)
    print("DETECT " + json.dumps(result), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="phase", required=True)
    m = sub.add_parser("manifest", help="tensor manifests from the upstream classes (CPU)")
    m.add_argument("--side", choices=("diffusers", "comfy"), required=True)
    m.add_argument("--source", required=True, help="diffusers: the tiny kit TI2V folder; comfy: ComfyUI's source")
    m.add_argument("--out", default=str(Path(__file__).with_name("manifest_ti2v5b.json")))
    m.add_argument("--tiny", action="store_true", help="the CPU rehearsal's small sizes (ComfyUI's VAE stays full)")
    m.set_defaults(fn=_manifest)
    w = sub.add_parser("weights", help="random real-size weights for both sides")
    w.add_argument("--base", required=True, help="ComfyUI base directory (models/ inside)")
    w.add_argument("--manifest", default=str(Path(__file__).with_name("manifest_ti2v5b.json")))
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--shard-gb", type=float, default=5.0)
    w.set_defaults(fn=_weights)
    d = sub.add_parser("detect", help="ComfyUI's detection of each single file")
    d.add_argument("--base", required=True)
    d.add_argument("--comfy-dir", required=True)
    d.add_argument("--cpu", action="store_true")
    d.add_argument("--out")
    d.set_defaults(fn=_detect)
    from . import calibrate, native, report   # their own options

    native.add_parser(sub)
    calibrate.add_parser(sub)
    report.add_parser(sub)
    a = p.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
