"""bench/memory/measure_memory.py: the case grid, and one tiny case when torch + diffusers are present."""
from __future__ import annotations

import importlib.util
from pathlib import Path


SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "memory" / "measure_memory.py"


def _load():
    spec = importlib.util.spec_from_file_location("measure_memory", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)     # no torch import at module level
    return mod


def test_grid_covers_480p_720p_81_121_tiling_for_both_vaes():
    mod = _load()
    cases = mod.default_cases(None)
    dec = {(c["vae"], c["height"], c["frames"], c["tiling"]) for c in cases if c["kind"] == "vae_decode"}
    for vae, heights in (("wan2.1", (480, 720)), ("wan2.2", (480, 704))):
        for h in heights:
            for f in (81, 121):
                for tiling in (False, True):
                    assert (vae, h, f, tiling) in dec
    assert {c["kind"] for c in cases} == {"vae_decode", "vae_encode", "dit"}
    assert mod.VAE_CONFIGS["wan2.2"]["z_dim"] == 48 and mod.VAE_CONFIGS["wan2.2"]["decoder_base_dim"] == 256
    assert mod.VAE_CONFIGS["wan2.1"]["base_dim"] == 96 and mod.VAE_CONFIGS["wan2.1"]["z_dim"] == 16
    assert len(mod.default_cases(5)) < len(cases)          # a frames override collapses 81/121


def test_one_tiny_case_runs_on_cpu():
    """The measuring code itself runs (server environment: it has torch and diffusers)."""
    import json
    import subprocess

    from stubserver import server_python

    code = ("import importlib.util, json, sys\n"
            "spec = importlib.util.spec_from_file_location('m', sys.argv[1]); mod = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(mod)\n"
            "out = mod.run_case(dict(kind='vae_decode', vae='wan2.1', width=64, height=48, frames=5, tiling=False),"
            " 'cpu', tiny=True)\n"
            "print(json.dumps(out))\n")
    run = subprocess.run([server_python(), "-c", code, str(SCRIPT)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["output_shape"] == [1, 3, 5, 48, 64] and out["extra_allocated_gib"] >= 0
