"""Exec the server command with all replicas of stage 0 on the first GPU(s): the one-GPU replica bench.

Our launch spec never puts two replicas on one GPU (right for users: they would share its memory
and compute), so the `--stage-overrides` it writes always lists a pool of distinct devices,
`{"0":{"num_replicas":N,"devices":"0,1,...,N*M-1"}}`. The bench for issue 17 has one lent H200
and wants N replicas on it, so the Supervisor launches this shim as its server program:

    python bench/gpu_replicas_shim.py PROGRAM... serve MODEL ... --stage-overrides '{...}' ...

It rewrites only the `devices` pool to the first replica's entries repeated N times
(`"0,1"` -> `"0,0"`), prints the rewrite to stderr (it lands in the server log), and replaces
itself with PROGRAM (os.execv: same pid, so the Supervisor's process group, its replica watch and
its stop rules see the real server exactly as without the shim).

vLLM-Omni 0.26 and 0.30 take a pool of N*M entries as "pool mode" (`split_devices_for_replicas`
in engine/stage_init_utils.py): replica r gets entries r*M .. r*M+M-1, mapped through
CUDA_VISIBLE_DEVICES, so `"0,0"` puts both 1-GPU replicas on logical GPU 0. (Without `devices`
every replica would inherit all visible GPUs, which with CUDA_VISIBLE_DEVICES=0 is the same GPU;
the explicit pool makes upstream log the split.) Runs under the server's python: standard
library only, nothing of our package.
"""
from __future__ import annotations

import json
import os
import sys


def one_gpu_argv(argv: list[str]) -> list[str]:
    """`argv` with every stage's replica device pool folded onto its first replica's devices."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg != "--stage-overrides":
            continue
        stages = json.loads(out[i + 1])
        for stage in stages.values():
            replicas, devices = int(stage.get("num_replicas", 1)), stage.get("devices")
            if replicas > 1 and devices:
                ids = [d for d in str(devices).split(",") if d]
                per = len(ids) // replicas
                stage["devices"] = ",".join(ids[:per] * replicas)
        out[i + 1] = json.dumps(stages, separators=(",", ":"))
    return out


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: gpu_replicas_shim.py PROGRAM [ARGS...]")
    argv = one_gpu_argv(sys.argv[1:])
    for before, after in zip(sys.argv[1:], argv):
        if before != after:
            print(f"[gpu_replicas_shim] one GPU for all replicas: --stage-overrides {before} -> {after}",
                  file=sys.stderr, flush=True)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
