"""N replicas of one parallel layout in one `vllm serve` process: the flag and the checks.

vLLM-Omni (0.26 and 0.30, the "single runtime" form) serves several copies of stage 0 from
one API process when the stage config says `num_replicas`: the orchestrator spawns one
`StageDiffusionProc` per replica (multiprocessing "spawn", children of the server process,
so in its process group) and sends each job to one of them, round-robin over the live ones.
The launcher writes no balancer; it only asks for the replicas and watches them.

How they are asked for (checked against the real 0.30 parser and config resolution by
tests/contract/test_replicas_supervised.py; 0.26 read in its source: the same
`parse_stage_overrides` -> `stage_0_num_replicas` -> `compute_replica_layout` path):

    --stage-overrides '{"0": {"num_replicas": N, "devices": "0,1,...,N*M-1"}}'

`devices` are logical indices into the server's CUDA_VISIBLE_DEVICES ("pool mode": N*M
entries, replica r gets entries r*M .. r*M+M-1, M = the layout's world size). Without
`devices` every replica would inherit all visible GPUs and share GPU 0.

What upstream does not do (docs/replicas.md): it never restarts a dead replica, and
`/health` stays 200 while the survivors serve, so the server quietly loses capacity; the
supervision package watches the replica processes (replica_watch.py).

I2V-A14B: upstream ignores `num_replicas` from `--stage-overrides` (and from a deploy YAML)
for it, because its pipeline class has no entry in upstream's pipeline registry; the
replicas would silently be one. It is refused with the alternatives.
"""
from __future__ import annotations

import json

from ...errors import SpecError
from ...models import WanFamily

# model_index.json classes that upstream's pipeline registry maps to a stage config (wan2_2_ti2v),
# the only Wan models whose stage config `num_replicas` reaches.
REPLICABLE_PIPELINES = ("WanPipeline",)
MAX_REPLICAS = 8


def stage_overrides(replicas: int, world_size: int) -> list[str]:
    """The flag pair that asks for `replicas` copies of a `world_size`-GPU layout ([] for one)."""
    if replicas <= 1:
        return []
    value = json.dumps({"0": {"num_replicas": replicas, "devices": device_pool(replicas, world_size)}},
                       separators=(",", ":"))
    return ["--stage-overrides", value]


def runtime_replica_flags(replicas: int, world_size: int) -> list[str]:
    """The same replicas for a head or headless runtime (`--stage-id`), where upstream takes the count
    from `--omni-dp-size-local` (a `num_replicas` would be overwritten) and splits the same pool."""
    if replicas <= 1:
        return []
    value = json.dumps({"0": {"devices": device_pool(replicas, world_size)}}, separators=(",", ":"))
    return ["--omni-dp-size-local", str(replicas), "--stage-overrides", value]


def device_pool(replicas: int, world_size: int) -> str:
    """Every replica's logical GPUs, in order: upstream gives replica r entries r*M .. r*M+M-1."""
    return ",".join(str(i) for i in range(replicas * world_size))


def check(replicas: int, family: WanFamily) -> None:
    """Refuse a replica count upstream cannot serve as asked (GPU counts are the spec's check)."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise SpecError(f"Replicas {replicas} is out of range", f"replicas must be 1..{MAX_REPLICAS}",
                        "set replicas to 1 (one server on its GPUs) or to the number of copies you want",
                        setting="replicas")
    if replicas > 1 and family.pipeline_class not in REPLICABLE_PIPELINES:
        raise SpecError(
            f"{family.label} cannot be served as {replicas} replicas",
            f"vLLM-Omni ignores num_replicas for {family.pipeline_class} (it has no entry in upstream's "
            "pipeline registry, so the stage override is never applied): the server would run one replica "
            "and leave the other GPUs idle",
            "set replicas to 1 and use the GPUs for one faster video (parallel mode cfg 2 on two GPUs), or "
            "serve T2V-A14B or TI2V-5B as replicas", setting="replicas")
