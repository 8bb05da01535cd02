"""Build a full-size, random-weight Wan2.2-T2V-A14B-shaped Diffusers folder (speed and memory only).

The GPU kit's make_fullsize_ti2v.py builds TI2V-5B shapes only; this is its A14B twin, with the
Wan2.2-T2V-A14B-Diffusers sizes: two 14.29 B-parameter experts (40 layers, 40x128 heads, ffn 13824,
16 latent channels, text_dim 4096), the Wan2.1 VAE (base_dim 96, z_dim 16, 8x spatial) and the same
UMT5-XXL-shaped encoder as TI2V-5B (d_model 4096, 24 layers, 64 heads, d_ff 10240, vocab 256384).
Tokenizer, scheduler and model_index (boundary 0.875) come from the kit's tiny A14B folder.

Disk: a real A14B folder is 65 GB, more than the 64 GiB device disk holds next to the venvs. The
weights are random anyway, so `transformer_2/` hardlinks `transformer/`'s weight files (one copy on
disk, about 29 GB); the server still loads both experts, so GPU memory and per-step speed are as
with real weights (the second expert reads from the page cache, so loading is a little faster).
`--text-encoder-from DIR` hardlinks an existing encoder of the same shape (the full-size TI2V-5B
folder's `text_encoder/`) instead of writing another 11.4 GB. `--rehearsal` builds the same layout
with tiny dimensions (the CPU rehearsal of the GPU session).

usage: make_fullsize_a14b.py TINY_A14B_DIR OUT_DIR [--text-encoder-from DIR] [--rehearsal]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

import torch

# (transformer keyword arguments, VAE config updates, UMT5 config updates) per build kind
FULL = (dict(num_attention_heads=40, attention_head_dim=128, in_channels=16, out_channels=16, text_dim=4096,
             ffn_dim=13824, num_layers=40),
        dict(base_dim=96),
        dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_decoder_layers=24,
             num_heads=64))
REHEARSAL = (dict(num_attention_heads=2, attention_head_dim=32, in_channels=16, out_channels=16, text_dim=64,
                  ffn_dim=128, num_layers=2),
             dict(base_dim=8),
             dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4))
ENCODER_KEYS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")


def link_tree(src: Path, dst: Path) -> int:
    """Hardlink every file of `src` into `dst` (a symlink where the filesystem refuses); bytes linked."""
    dst.mkdir(parents=True, exist_ok=True)
    total = 0
    for item in sorted(src.iterdir()):
        if item.is_file():
            target = dst / item.name
            try:
                os.link(item, target)
            except OSError:
                target.symlink_to(item.resolve())
            total += item.stat().st_size
    return total


def encoder_matches(folder: Path, wanted: dict) -> bool:
    """True when `folder` holds a UMT5 encoder with the wanted shape (and weights)."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return all(cfg.get(k) == wanted[k] for k in ENCODER_KEYS) and any(folder.glob("*.safetensors"))


def build(tiny: Path, out: Path, text_encoder_from: Path | None, rehearsal: bool) -> dict:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    t0 = time.time()
    tr_kw, vae_kw, te_kw = REHEARSAL if rehearsal else FULL
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(tiny, out, ignore=shutil.ignore_patterns("*.safetensors"))
    for sub in ("transformer", "transformer_2", "vae", "text_encoder"):
        shutil.rmtree(out / sub, ignore_errors=True)
    torch.manual_seed(0)
    report: dict = {"device": dev, "rehearsal": rehearsal}

    with torch.device(dev):
        tr = WanTransformer3DModel(patch_size=(1, 2, 2), freq_dim=256, cross_attn_norm=True,
                                   qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
                                   rope_max_seq_len=1024, pos_embed_seq_len=None, **tr_kw)
    tr = tr.to(torch.bfloat16)
    tr.save_pretrained(out / "transformer", safe_serialization=True, max_shard_size="5GB")
    report["expert_params_b"] = round(sum(p.numel() for p in tr.parameters()) / 1e9, 3)
    del tr
    (out / "transformer_2").mkdir()
    shutil.copy2(out / "transformer" / "config.json", out / "transformer_2" / "config.json")
    shared = [f for f in (out / "transformer").iterdir() if f.name != "config.json"]
    for f in shared:
        os.link(f, out / "transformer_2" / f.name)
    report["transformer_2"] = f"hardlinks to transformer/ ({len(shared)} files)"
    print(f"experts 2 x {report['expert_params_b']:.2f} B params (one copy on disk)  t={time.time() - t0:.0f}s",
          flush=True)

    vcfg = json.loads((tiny / "vae" / "config.json").read_text())
    vcfg = {k: v for k, v in vcfg.items() if not k.startswith("_")}
    vcfg.update(vae_kw)
    with torch.device(dev):
        vae = AutoencoderKLWan(**vcfg)
    vae.to(torch.float32).save_pretrained(out / "vae", safe_serialization=True)
    report["vae_params_m"] = round(sum(p.numel() for p in vae.parameters()) / 1e6, 1)
    del vae
    print(f"vae {report['vae_params_m']:.0f} M params  t={time.time() - t0:.0f}s", flush=True)

    tcfg = json.loads((tiny / "text_encoder" / "config.json").read_text())
    tcfg.update(te_kw)
    for k in ("architectures", "transformers_version", "dtype"):
        tcfg.pop(k, None)
    if text_encoder_from is not None and encoder_matches(text_encoder_from, tcfg):
        linked = link_tree(text_encoder_from, out / "text_encoder")
        report["text_encoder"] = f"linked from {text_encoder_from} ({linked / 1e9:.1f} GB)"
    else:
        cfg = UMT5Config(**tcfg)
        cfg.architectures = ["UMT5EncoderModel"]
        with torch.device(dev):
            te = UMT5EncoderModel(cfg)
        te.to(torch.bfloat16).save_pretrained(out / "text_encoder", safe_serialization=True, max_shard_size="5GB")
        report["text_encoder"] = f"built ({sum(p.numel() for p in te.parameters()) / 1e9:.2f} B params)"
        del te
    print(f"text encoder {report['text_encoder']}  t={time.time() - t0:.0f}s", flush=True)
    report["build_s"] = round(time.time() - t0, 1)
    report["disk_bytes"] = disk_bytes(out)
    (out / "fullsize_build.json").write_text(json.dumps(report, indent=1))
    return report


def disk_bytes(folder: Path) -> int:
    """Bytes the folder occupies, each hardlinked inode counted once (what `du` says)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            st = path.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiny", type=Path, help="the GPU kit's tiny-wan22-t2v-a14b folder")
    parser.add_argument("out", type=Path)
    parser.add_argument("--text-encoder-from", type=Path, default=None,
                        help="a text_encoder/ folder of the same UMT5-XXL shape to hardlink (else one is built)")
    parser.add_argument("--rehearsal", action="store_true", help="tiny dimensions, same layout (CPU rehearsal)")
    args = parser.parse_args()
    print(json.dumps(build(args.tiny, args.out, args.text_encoder_from, args.rehearsal)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
