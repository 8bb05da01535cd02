#!/usr/bin/env python3
"""Measure the Wan2.2 memory terms the published numbers do not cover (random weights, no download).

What it measures, each case in a fresh subprocess so one case's cache never leaks into the next:

* ``vae_decode`` - the VAE decode peak for a video latent: diffusers' ``AutoencoderKLWan`` with
  the real Wan2.1 VAE config (used by T2V/I2V-A14B: z_dim 16, base_dim 96, x8 spatial) and the
  real Wan2.2 VAE config (TI2V-5B: z_dim 48, base_dim 160, decoder_base_dim 256, is_residual,
  patch_size 2, x16 spatial), in bf16 as vLLM-Omni loads it, with and without tiling.
* ``vae_encode`` - the I2V-A14B condition encode: the pipeline VAE-encodes the start image
  followed by F-1 black frames at full resolution (Wan2.1 VAE), with and without tiling.
* ``dit`` - DiT activations per token: one real-width WanTransformer3DModel layer (A14B:
  40 heads x 128, ffn 13824; TI2V-5B: 24 x 128, ffn 14336) on the real latent shape; the
  peak minus the weights is the activation working set of a 40/30-layer model (layers do not
  keep activations at inference).

On CUDA (``--device cuda``) each case reports ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` above the baseline (weights + inputs). On CPU (``--device cpu``) it
reports the peak resident set (``ru_maxrss``) above the same baseline, with glibc's mmap
threshold pinned low so freed tensors return to the OS (an approximation of "allocated").

Usage:
  # the GPU run (H200, ~10 min; needs torch + diffusers>=0.35, nothing else):
  python bench/memory/measure_memory.py --device cuda --out bench/memory/results/h200.json
  # a check that every case builds and runs, on CPU, in seconds (tiny widths and sizes):
  python bench/memory/measure_memory.py --dry-run
  # real widths on CPU at reduced frame counts (minutes; used to calibrate planner/):
  python bench/memory/measure_memory.py --device cpu --frames 5 --out bench/memory/results/cpu.json

Nothing here imports the launcher; the planner reads the JSON it writes (``bench/memory/results``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

GIB = 1024 ** 3

# Real configs (Wan-AI/*-Diffusers vae/config.json and transformer/config.json shapes).
VAE_CONFIGS = {
    "wan2.1": dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                   temperal_downsample=[False, True, True], dropout=0.0, is_residual=False,
                   in_channels=3, out_channels=3, patch_size=None, scale_factor_temporal=4,
                   scale_factor_spatial=8),
    "wan2.2": dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                   attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0, is_residual=True,
                   in_channels=12, out_channels=12, patch_size=2, scale_factor_temporal=4,
                   scale_factor_spatial=16),
}
DIT_CONFIGS = {
    "a14b": dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                 out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=1,
                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
                 added_kv_proj_dim=None, rope_max_seq_len=1024, pos_embed_seq_len=None),
    "ti2v5b": dict(patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48,
                   out_channels=48, text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=1,
                   cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
                   added_kv_proj_dim=None, rope_max_seq_len=1024, pos_embed_seq_len=None),
}
# Tiny widths for --dry-run (same structure, so every code path runs).
TINY_VAE = {"base_dim": 4, "decoder_base_dim": None}
TINY_DIT = {"num_attention_heads": 2, "attention_head_dim": 64, "ffn_dim": 128, "text_dim": 32}


def default_cases(frames_override: int | None) -> list[dict]:
    """The grid: 480p/720p x 81/121 frames x tiling for both VAEs, the I2V encode, DiT per token."""
    cases = []
    for vae, sizes in (("wan2.1", [(832, 480), (1280, 720)]), ("wan2.2", [(832, 480), (1280, 704)])):
        for w, h in sizes:
            for f in (81, 121):
                for tiling in (False, True):
                    cases.append(dict(kind="vae_decode", vae=vae, width=w, height=h,
                                      frames=frames_override or f, tiling=tiling))
    for w, h in ((832, 480), (1280, 720)):
        for tiling in (False, True):
            cases.append(dict(kind="vae_encode", vae="wan2.1", width=w, height=h,
                              frames=frames_override or 81, tiling=tiling))
    for dit, sizes, f in (("a14b", [(832, 480), (1280, 720)], 81), ("ti2v5b", [(1280, 704)], 121)):
        for w, h in sizes:
            cases.append(dict(kind="dit", dit=dit, width=w, height=h, frames=frames_override or f))
    # dedupe (a frames override collapses 81/121)
    seen, out = set(), []
    for c in cases:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def tiny_cases() -> list[dict]:
    return [
        dict(kind="vae_decode", vae="wan2.1", width=64, height=48, frames=9, tiling=False),
        dict(kind="vae_decode", vae="wan2.1", width=320, height=288, frames=5, tiling=True),
        dict(kind="vae_decode", vae="wan2.2", width=64, height=64, frames=9, tiling=False),
        dict(kind="vae_encode", vae="wan2.1", width=64, height=48, frames=9, tiling=False),
        dict(kind="dit", dit="a14b", width=64, height=48, frames=9),
        dict(kind="dit", dit="ti2v5b", width=64, height=64, frames=9),
    ]


# --------------------------------------------------------------------------- one case (child process)
class Meter:
    """Peak memory above a baseline, on CUDA (allocator stats) or CPU (peak RSS)."""

    def __init__(self, torch, device: str):
        self.torch, self.device = torch, device

    def _rss(self) -> int:
        import resource
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()

    def start(self) -> None:
        t = self.torch
        if self.device == "cuda":
            t.cuda.synchronize()
            t.cuda.empty_cache()
            t.cuda.reset_peak_memory_stats()
            self.base_alloc = t.cuda.memory_allocated()
            self.base_reserved = t.cuda.memory_reserved()
        else:
            import gc
            gc.collect()
            self.base_rss = self._rss()
            self.hwm_reset = _reset_peak_rss()

    def stop(self) -> dict:
        t = self.torch
        if self.device == "cuda":
            t.cuda.synchronize()
            return {"baseline_allocated_gib": self.base_alloc / GIB,
                    "peak_allocated_gib": t.cuda.max_memory_allocated() / GIB,
                    "peak_reserved_gib": t.cuda.max_memory_reserved() / GIB,
                    "extra_allocated_gib": (t.cuda.max_memory_allocated() - self.base_alloc) / GIB,
                    "extra_reserved_gib": (t.cuda.max_memory_reserved() - self.base_alloc) / GIB}
        peak = _peak_rss()
        note = "" if self.hwm_reset else "could not reset the peak RSS (/proc/self/clear_refs): an upper bound"
        return {"baseline_rss_gib": self.base_rss / GIB, "peak_rss_gib": peak / GIB,
                "extra_allocated_gib": max(0, peak - self.base_rss) / GIB, "note": note}


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_case(case: dict, device: str, tiny: bool) -> dict:
    import torch
    torch.manual_seed(0)
    dtype = torch.bfloat16
    torch.set_default_dtype(dtype)   # build weights in bf16 directly (no fp32 copy at init)
    dev = torch.device(device)
    meter = Meter(torch, device)
    w, h, f = case["width"], case["height"], case["frames"]
    lat_f = (f - 1) // 4 + 1
    t0 = time.time()
    out: dict = {}
    with torch.inference_mode():
        if case["kind"] in ("vae_decode", "vae_encode"):
            from diffusers import AutoencoderKLWan
            cfg = dict(VAE_CONFIGS[case["vae"]])
            if tiny:
                cfg.update(base_dim=TINY_VAE["base_dim"])
                cfg.pop("decoder_base_dim", None)
                if case["vae"] == "wan2.2":
                    cfg["decoder_base_dim"] = 8
            with dev:
                vae = AutoencoderKLWan(**cfg)
            vae = vae.to(dtype).eval()
            if case["tiling"]:
                vae.enable_tiling()
            s = cfg["scale_factor_spatial"]
            out["vae_params_m"] = sum(p.numel() for p in vae.parameters()) / 1e6
            if case["kind"] == "vae_decode":
                z = torch.randn(1, cfg["z_dim"], lat_f, h // s, w // s, device=dev, dtype=dtype)
                meter.start()
                video = vae.decode(z, return_dict=False)[0]
            else:
                # I2V-A14B condition: the image then F-1 zero frames, encoded at full resolution
                x = torch.zeros(1, 3, f, h, w, device=dev, dtype=dtype)
                x[:, :, 0] = torch.randn(1, 3, h, w, device=dev, dtype=dtype)
                meter.start()
                video = vae.encode(x).latent_dist.mode()
            out.update(meter.stop())
            out["output_shape"] = list(video.shape)
            out["output_gib"] = video.numel() * video.element_size() / GIB
        elif case["kind"] == "dit":
            from diffusers import WanTransformer3DModel
            cfg = dict(DIT_CONFIGS[case["dit"]])
            if tiny:
                cfg.update(TINY_DIT)
            s = 16 if case["dit"] == "ti2v5b" else 8
            with dev:
                model = WanTransformer3DModel(**cfg)
            model = model.to(dtype).eval()
            # as from_pretrained(torch_dtype=bf16) loads it: these stay fp32 (diffusers _keep_in_fp32_modules)
            keep = getattr(model, "_keep_in_fp32_modules", None) or []
            for name, module in model.named_modules():
                if any(k in name.split(".") for k in keep):
                    module.to(torch.float32)
            if hasattr(model, "scale_shift_table") and "scale_shift_table" in keep:
                model.scale_shift_table.data = model.scale_shift_table.data.float()
            for block in getattr(model, "blocks", []):
                if "scale_shift_table" in keep and hasattr(block, "scale_shift_table"):
                    block.scale_shift_table.data = block.scale_shift_table.data.float()
            lat = torch.randn(1, cfg["in_channels"], lat_f, h // s, w // s, device=dev, dtype=dtype)
            text = torch.randn(1, 512, cfg["text_dim"], device=dev, dtype=dtype)
            if case["dit"] == "ti2v5b":   # expand_timesteps: one timestep per token
                tokens = lat_f * (h // s // 2) * (w // s // 2)
                timestep = torch.full((1, tokens), 500.0, device=dev)
            else:
                timestep = torch.tensor([500.0], device=dev)
            meter.start()
            pred = model(hidden_states=lat, timestep=timestep, encoder_hidden_states=text, return_dict=False)[0]
            out.update(meter.stop())
            tokens = lat_f * (h // s // 2) * (w // s // 2)
            hidden = cfg["num_attention_heads"] * cfg["attention_head_dim"]
            out["tokens"] = tokens
            out["hidden_dim"] = hidden
            out["bytes_per_token"] = out["extra_allocated_gib"] * GIB / tokens
            out["hidden_units"] = out["bytes_per_token"] / (hidden * 2)
            out["output_shape"] = list(pred.shape)
    out["seconds"] = round(time.time() - t0, 2)
    return out


# --------------------------------------------------------------------------- driver
def _environment(device: str) -> dict:
    env = {"python": platform.python_version(), "device": device}
    try:
        import torch
        env["torch"] = torch.__version__
        if device == "cuda" and torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["gpu_total_gib"] = torch.cuda.get_device_properties(0).total_memory / GIB
    except ImportError:
        env["torch"] = None
    try:
        import diffusers
        env["diffusers"] = diffusers.__version__
    except ImportError:
        env["diffusers"] = None
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny widths and sizes on CPU: checks that every case kind builds and runs")
    ap.add_argument("--frames", type=int, default=None,
                    help="override every case's frame count (e.g. 5 for a quick CPU calibration)")
    ap.add_argument("--only", default="", help="comma list of kinds to run: vae_decode,vae_encode,dit")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    ap.add_argument("--out", default="", help="write results JSON here (default: print only)")
    ap.add_argument("--case", default="", help=argparse.SUPPRESS)   # child mode: one JSON case
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.case:   # child
        result = run_case(json.loads(args.case), args.device, args.tiny)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    device = "cpu" if args.dry_run else args.device
    cases = tiny_cases() if args.dry_run else default_cases(args.frames)
    if args.only:
        kinds = set(args.only.split(","))
        cases = [c for c in cases if c["kind"] in kinds]
    env = dict(os.environ)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")   # CPU: freed tensors go back to the OS at once
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    results = []
    for case in cases:
        cmd = [sys.executable, os.path.abspath(__file__), "--device", device, "--case", json.dumps(case)]
        if args.dry_run:
            cmd.append("--tiny")
        t0 = time.time()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode == 0 and line:
                res = dict(case, ok=True, **json.loads(line[7:]))
            else:
                tail = (proc.stderr or proc.stdout)[-1500:]
                oom = "out of memory" in tail.lower()
                res = dict(case, ok=False, oom=oom, error=tail.strip().splitlines()[-1] if tail.strip() else "")
        except subprocess.TimeoutExpired:
            res = dict(case, ok=False, error=f"timeout after {args.timeout:.0f} s")
        res.setdefault("seconds", round(time.time() - t0, 2))
        results.append(res)
        shown = (f"{res.get('extra_allocated_gib', float('nan')):7.2f} GiB extra" if res["ok"]
                 else "FAILED " + res.get("error", ""))
        print(f"{case['kind']:10s} {case.get('vae', case.get('dit')):7s} {case['width']}x{case['height']}x"
              f"{case['frames']:<4d} tiling={case.get('tiling', '-')!s:5s} {shown}", flush=True)
    doc = {"environment": _environment(device), "dry_run": args.dry_run, "frames_override": args.frames,
           "units": "GiB (2**30 bytes)", "results": results}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)
        print(f"wrote {args.out}")
    failed = [r for r in results if not r["ok"]]
    return 1 if failed and args.dry_run else 0


if __name__ == "__main__":
    sys.exit(main())
