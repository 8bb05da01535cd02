"""`python -m bench.gpu <phase> ...`, from the repository root.

  manifest   (CPU) tensor names/shapes of both sides from the upstream classes -> bench/gpu/manifest_<family>.json
  weights    (device, image python) random real-size weights: ComfyUI single files + our Diffusers folder
  detect     (ComfyUI's python) what ComfyUI's model detection makes of each single file
  native     (ComfyUI's python) issue 26 section 1: ComfyUI's native Wan2.2 5B workflow and our template
             in one ComfyUI, same request, per-side timings, NVML peak, host RAM
  calibrate  (server venv python) issue 25: memory + speed per offload/tiling config and shape through our
             Supervisor and client, NVML peak per job; --caps runs jobs under the allocator cap
  levers     (server venv python) issue 26 section 3: our speed levers (compile, cache-dit, FP8, attention
             backends), one server each, PSNR drift vs eager; --cli-jobs: the CLI generate path (issue 25)
  pipeline-manifest  (CPU, server venv) issue 30: a VACE / S2V / FastWan pipeline's tensors from the upstream
             classes -> bench/gpu/manifest_<pipeline>.json (bench/gpu/pipeline_manifest.py)
  pipeline-weights   (device, image python) its random real-size weights in the repo's layout; --remove
  pipeline   (ComfyUI's python) issue 30: that pipeline through our template in ComfyUI, first + warm job at the
             template's shape and a held-out shape, NVML peak against the planner's
  report     (any python) the markdown tables of a results folder (one combined ours / native table over
             every head-to-head report under it: the device calls of one session)
`--family` (manifest, weights, detect, native): ti2v-5b (default) or t2v-a14b (bench/gpu/families.py).
bench/gpu/rehearse.sh: the CPU rehearsal of a family's device calls at tiny sizes (ComfyUI --cpu + stub server).

The earlier phases are the scripts beside this package in bench/, reached from here by name with their own
options (`python -m bench.gpu e2e --help`); they share bench/gpu/common.py with the phases above:
  e2e (gpu_e2e.py), comfyui-e2e (gpu_comfyui_e2e.py), a14b (gpu_a14b.py), join (gpu_join.py),
  replicas (gpu_replicas.py), lora-check (lora_gpu_check.py), overhead (overhead_bench.py),
  throughput (throughput_bench.py), decode (decode_bench.py), detect-stub (detect_bench.py),
  no-gpu (no_gpu_bench.py)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .families import FAMILIES, SHM, family


def _manifest(a: argparse.Namespace) -> int:
    from . import weights

    fam = family(a.family)
    doc = weights.write_manifest(a.side, Path(a.source), Path(a.out or fam.manifest), full_size=not a.tiny, fam=fam)
    print(f"{a.out or fam.manifest}: sides {sorted(k for k in doc if k != 'family')}")
    return 0


def _weights(a: argparse.Namespace) -> int:
    from . import weights

    fam = family(a.family)
    manifest = json.loads(Path(a.manifest or fam.manifest).read_text())
    if manifest.get("family", fam.name) != fam.name:
        raise SystemExit(f"{a.manifest}: a {manifest['family']} manifest, not {fam.name}'s (--family)")
    report = weights.build(manifest, Path(a.base), seed=a.seed, shard_bytes=int(a.shard_gb * 1e9), fam=fam,
                           shm=Path(a.shm), fp8_marker_elements=a.fp8_marker_elements,
                           reserve=int(a.reserve_gib * (1 << 30)))
    print("WEIGHTS " + json.dumps(report), flush=True)
    return 0


def _detect(a: argparse.Namespace) -> int:
    from .detect import detect

    result = detect(Path(a.base), Path(a.comfy_dir), cpu=a.cpu, fam=family(a.family))
    print("DETECT " + json.dumps(result), flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0 if result["ok"] else 1


def _pipeline_manifest(a: argparse.Namespace) -> int:
    from . import pipeline_manifest
    from .pipeline_families import pipeline

    p = pipeline(a.pipeline)
    doc = pipeline_manifest.write(p, Path(a.tokenizer), Path(a.out or p.manifest), tiny=a.tiny)
    print(f"{a.out or p.manifest}: " + ", ".join(f"{x['name']} {len(x['tensors'])} tensors" for x in doc["parts"]))
    return 0


def _pipeline_weights(a: argparse.Namespace) -> int:
    from . import pipeline_weights
    from .pipeline_families import pipeline

    p = pipeline(a.pipeline)
    if a.remove:
        print("PIPELINE-WEIGHTS " + json.dumps(pipeline_weights.remove(Path(a.base), p, shared=a.shared)), flush=True)
        return 0
    manifest = json.loads(Path(a.manifest or p.manifest).read_text())
    report = pipeline_weights.build(manifest, Path(a.base), p, seed=a.seed, shard_bytes=int(a.shard_gb * 1e9),
                                    reserve=int(a.reserve_gib * (1 << 30)))
    print("PIPELINE-WEIGHTS " + json.dumps(report), flush=True)
    return 0


SCRIPTS = {"e2e": "gpu_e2e.py", "comfyui-e2e": "gpu_comfyui_e2e.py", "a14b": "gpu_a14b.py", "join": "gpu_join.py",
           "replicas": "gpu_replicas.py", "lora-check": "lora_gpu_check.py", "overhead": "overhead_bench.py",
           "throughput": "throughput_bench.py", "decode": "decode_bench.py", "detect-stub": "detect_bench.py",
           "no-gpu": "no_gpu_bench.py"}


def _script(name: str, args: list[str]) -> int:
    """Run one of the bench/ scripts as its own `__main__`, with the options after its name."""
    import runpy

    path = Path(__file__).resolve().parents[1] / SCRIPTS[name]
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in SCRIPTS:      # everything after the name is the script's own
        return _script(argv[0], argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="phase", required=True)
    m = sub.add_parser("manifest", help="tensor manifests from the upstream classes (CPU)")
    m.add_argument("--side", choices=("diffusers", "comfy"), required=True)
    m.add_argument("--source", required=True, help="diffusers: the tiny kit TI2V folder; comfy: ComfyUI's source")
    m.add_argument("--out", help="default: the family's committed manifest (bench/gpu/manifest_<family>.json)")
    m.add_argument("--tiny", action="store_true", help="the CPU rehearsal's small sizes (ComfyUI's VAE stays full)")
    m.set_defaults(fn=_manifest)
    w = sub.add_parser("weights", help="random real-size weights for both sides")
    w.add_argument("--base", required=True, help="ComfyUI base directory (models/ inside)")
    w.add_argument("--manifest", help="default: the family's committed manifest")
    w.add_argument("--shm", default=str(SHM), help="where the family's in-memory files go (T2V-A14B: the ComfyUI "
                   "fp8 diffusion file, 13.3 GiB)")
    w.add_argument("--reserve-gib", type=float, default=0.0, help="disk kept free beyond the weights (what "
                   "arrives after them: the kit pieces, the unpacked kit, the venvs)")
    w.add_argument("--fp8-marker-elements", type=int, default=0, choices=(0, 2),
                   help="the scaled_fp8 marker's length: 0 as ComfyUI saves it (fp8 matmul where the card has "
                        "fp8 compute), 2 = ComfyUI casts to bf16 instead")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--shard-gb", type=float, default=5.0)
    w.set_defaults(fn=_weights)
    d = sub.add_parser("detect", help="ComfyUI's detection of each single file")
    d.add_argument("--base", required=True)
    d.add_argument("--comfy-dir", required=True)
    d.add_argument("--cpu", action="store_true")
    d.add_argument("--out")
    for sp in (m, w, d):
        sp.add_argument("--family", choices=sorted(FAMILIES), default="ti2v-5b")
    d.set_defaults(fn=_detect)
    from .pipeline_families import PIPELINES

    pm = sub.add_parser("pipeline-manifest", help="issue 30: a pipeline's tensor manifest (CPU, server venv)")
    pm.add_argument("--tokenizer", required=True, help="a T5TokenizerFast folder (the kit's tiny-wan22-ti2v/tokenizer)")
    pm.add_argument("--out", help="default: the pipeline's committed manifest (bench/gpu/manifest_<pipeline>.json)")
    pm.add_argument("--tiny", action="store_true", help="the CPU rehearsal's small sizes, same layout")
    pm.set_defaults(fn=_pipeline_manifest)
    pw = sub.add_parser("pipeline-weights", help="issue 30: a pipeline's random real-size weights (or --remove)")
    pw.add_argument("--base", required=True, help="ComfyUI base directory (models/diffusers/<pipeline>-fullsize)")
    pw.add_argument("--manifest", help="default: the pipeline's committed manifest")
    pw.add_argument("--reserve-gib", type=float, default=0.0, help="disk kept free beyond the weights")
    pw.add_argument("--seed", type=int, default=0)
    pw.add_argument("--shard-gb", type=float, default=5.0)
    pw.add_argument("--remove", action="store_true", help="delete the pipeline's folder instead (disk for the next)")
    pw.add_argument("--shared", action="store_true", help="with --remove: the shared UMT5 file too")
    pw.set_defaults(fn=_pipeline_weights)
    for sp in (pm, pw):
        sp.add_argument("--pipeline", choices=sorted(PIPELINES), required=True)
    from . import calibrate, levers, native, pipeline_run, report   # their own options

    native.add_parser(sub)
    pipeline_run.add_parser(sub)
    levers.add_parser(sub)
    calibrate.add_parser(sub)
    report.add_parser(sub)
    for name, script in SCRIPTS.items():
        sub.add_parser(name, help=f"bench/{script} (its own options follow)", add_help=False)
    a = p.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
