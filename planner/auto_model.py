"""Which Wan2.2 model to serve when the user names none (`generate --prompt "..."` alone).

The shortest command should give a video soon on whatever machine it runs on, so the rule
weighs what a first run costs: a 65 GB download (A14B) or a 23 GB one (TI2V-5B), and whether
the model fits this machine's GPUs at its default request. In order:

1. a model already in the Hugging Face cache that fits: T2V-A14B (the better quality) before
   TI2V-5B, since nothing has to be downloaded; with a start image (`--image`) I2V-A14B before
   TI2V-5B, the models that take one (a text-to-video pick would only refuse the image);
2. TI2V-5B: the smallest download, and it fits one 24 GB GPU;
3. without GPU sizes (no NVML, no VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB) nothing can be planned,
   so TI2V-5B, the model most machines run.

"Fits" is planned for the vLLM-Omni line of the server environment that will serve it
(`launch_plan.planning_version`). The answer comes with its reason in words, which the command
prints before it starts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..models import FAMILIES
from ..server.config.local_config import LocalConfig
from ..server.launch.flags import Version
from ..server.launch.hf_cache import has_snapshot
from ..server.launch.spec import LaunchSpec
from .ladder import recommend
from .launch_plan import planning_version

# This rule's preference, not a family fact: better quality first, without and with a start image.
_QUALITY_ORDER = {False: ("t2v_a14b", "ti2v_5b"), True: ("i2v_a14b", "ti2v_5b")}
FALLBACK = "ti2v_5b"


@dataclass(frozen=True)
class ModelPick:
    """The model to serve and why, in a sentence."""

    model: str              # an HF id
    why: str


def pick_model(config: LocalConfig, gpu_sizes: list[float], gpu_source: str,
               start_image: bool = False) -> ModelPick:
    """The model for this machine: `gpu_sizes` (GiB each, [] when unknown) from `gpu_source`;
    `start_image`: the request brings one (only I2V-A14B and TI2V-5B take it)."""
    order = _QUALITY_ORDER[start_image]
    ti2v, a14b = FAMILIES[FALLBACK], FAMILIES[order[0]]
    if not gpu_sizes:
        return ModelPick(ti2v.hf_id, f"{gpu_source}, so nothing can be planned: {ti2v.label} is the smallest "
                                     f"text-to-video model (about {ti2v.download_gb} GB to download, one "
                                     "24 GB GPU is enough)")
    env = {**os.environ, **config.extra_env}        # HF_HOME / HF_HUB_CACHE as the server sees them
    version, _ = planning_version(config)           # a refused environment is refused by the launch, after this
    fits = {key: _fits(FAMILIES[key].hf_id, gpu_sizes, version) for key in order}
    gpus = " + ".join(f"{size:g}" for size in gpu_sizes) + " GiB"
    for key in order:
        family = FAMILIES[key]
        if fits[key] and has_snapshot(family.hf_id, env):
            return ModelPick(family.hf_id, f"it is already downloaded and fits these GPUs ({gpus}) at its "
                                           f"default {family.width}x{family.height}x{family.frames}")
    if fits[FALLBACK]:
        why = (f"it fits these GPUs ({gpus}) and is the smallest download (about {ti2v.download_gb} GB; "
               f"{a14b.label} is about {a14b.download_gb} GB"
               + (f", and it fits too: pass --model {a14b.hf_id} for it)" if fits[a14b.key] else ")"))
    else:
        why = (f"no Wan2.2 model fits these GPUs ({gpus}) at its default request; {ti2v.label} comes closest "
               "and the planner reduces the request to what fits")
    return ModelPick(ti2v.hf_id, why)


def _fits(model: str, gpu_sizes: list[float], server_version: Optional[Version]) -> bool:
    """Whether some configuration runs `model`'s default request on these GPUs unreduced."""
    rec = recommend(LaunchSpec(model=model), gpus=gpu_sizes, server_version=server_version)
    return rec.spec is not None and not rec.reduced
