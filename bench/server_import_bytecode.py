"""The server's Python start with and without compiled bytecode, in the same run on one machine.

`vllm serve MODEL --omni` imports vllm, vllm-omni and torch before it logs anything. In a venv whose
packages were installed without bytecode (uv's default; pip compiles by default), the first start compiles
every imported module while ComfyUI waits on Local Server. `setup` therefore asks uv for
`--compile-bytecode` (server/create_server_env.sh). This measures what that moves out of the first start:
fresh processes importing the server's entry modules, alternating

- `uncompiled`: PYTHONPYCACHEPREFIX an empty folder and PYTHONDONTWRITEBYTECODE=1, so no bytecode is found
  and every module is compiled from source (each repeat as cold as the first start of such a venv);
- `compiled`: the venv's own __pycache__ (compileall'd once before the timings).

Only the import part of a start: engine init, weight loading and warm-up come on top and are the same.

    .venv/bin/python bench/server_import_bytecode.py --python .venv-server/bin/python [--repeat 3]

Prints the medians and their ratio and writes bench/out/server_import_bytecode.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRY = "import vllm_omni, vllm; from vllm.entrypoints.cli import main"   # what `vllm serve --omni` imports first


def one_import(python: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-c", ENTRY], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=900)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", required=True, help="the server venv's python")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=str(Path(__file__).parent / "out" / "server_import_bytecode.json"))
    a = p.parse_args()
    site = subprocess.run([a.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([a.python, "-m", "compileall", "-q", "-j", "0", site], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    times: dict[str, list[float]] = {"uncompiled": [], "compiled": []}
    with tempfile.TemporaryDirectory() as empty:
        cold = dict(base, PYTHONPYCACHEPREFIX=empty, PYTHONDONTWRITEBYTECODE="1")
        one_import(a.python, base)          # page cache warm for both kinds alike
        for _ in range(a.repeat):           # alternating: a busy machine slows both alike
            times["uncompiled"].append(one_import(a.python, cold))
            times["compiled"].append(one_import(a.python, base))
    med = {k: statistics.median(v) for k, v in times.items()}
    doc = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "entry": ENTRY, "seconds": times,
           "median_s": med, "ratio_compiled_over_uncompiled": med["compiled"] / med["uncompiled"],
           "saved_s": med["uncompiled"] - med["compiled"],
           "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print(f"import of the server's entry modules: uncompiled {med['uncompiled']:.1f} s, compiled "
          f"{med['compiled']:.1f} s (ratio {doc['ratio_compiled_over_uncompiled']:.2f}, {doc['saved_s']:.1f} s "
          f"saved per first start); {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
