"""Knowledge about `vllm serve --omni` flags that is not in the launch spec's fields.

Three tables, each checked against the real 0.30 parser by the contract tests:
- flags from blog posts that do not exist, with what to use instead;
- flags a workflow must never set (they come from the local machine's configuration);
- extra flags a user may add, with the oldest vLLM-Omni version that has each.
"""
from __future__ import annotations

from dataclasses import dataclass

Version = tuple[int, int]

# Flags that blog posts advertise but neither 0.26 nor 0.30 has
# (docs/upstream-facts.md, "Flags that do not exist").
NONEXISTENT_FLAGS: dict[str, str] = {
    "--model-type": "nothing: the pipeline comes from the model's model_index.json "
                    "(to force one, use --model-class-name WanPipeline|WanImageToVideoPipeline)",
    "--mm-cache-capacity": "nothing for Wan (vLLM's --mm-processor-cache-gb is unrelated)",
    "--no-enable-paged-attention": "nothing: Wan runs the dense attention mode by default",
    "--enable-gradient-checkpointing": "nothing: it is a training option, not a serving flag",
    "--max-num-batched-requests": "--max-num-seqs N with --request-batch-max-wait-ms",
    "--num-gpus": "a parallel mode and degree (--num-gpus is accepted upstream but ignored: world size stays 1)",
    "--stage-configs-path": "CLI flags (removed in vLLM-Omni 0.30; use --deploy-config on 0.30)",
}

# Flags only the local machine's configuration may decide, never a workflow or extra flag.
LOCAL_ONLY_FLAGS: dict[str, str] = {
    "--host": "the bind host (set VLLM_OMNI_LAUNCHER_HOST or 'host' in the local config file)",
    "--port": "the port (chosen free on 127.0.0.1 at launch, or 'port' in the local config)",
    "--api-key": "the API key (a fresh one is generated per launch and passed by environment)",
    "--trust-remote-code": "trust_remote_code (set it in the local config file)",
    "--allowed-origins": "CORS origins (not configurable from a workflow)",
    "--ssl-keyfile": "TLS (not configurable from a workflow)",
    "--ssl-certfile": "TLS (not configurable from a workflow)",
    "--root-path": "the URL root (not configurable from a workflow)",
    "--deploy-config": "the launcher's own settings (a deploy YAML is ignored for I2V-A14B; "
                       "the launcher configures every model with CLI flags)",
}


@dataclass(frozen=True)
class ExtraFlag:
    """A flag users may append; `takes_value` False means a bare switch."""

    takes_value: bool
    since: Version = (0, 26)
    choices: tuple[str, ...] = ()


EXTRA_FLAGS: dict[str, ExtraFlag] = {
    "--max-num-seqs": ExtraFlag(True),
    "--request-batch-max-wait-ms": ExtraFlag(True),
    "--vae-parallel-mode": ExtraFlag(True, choices=("tile", "spatial_shard_height", "spatial_shard_width")),
    "--diffusion-attention-backend": ExtraFlag(True),
    "--cache-config": ExtraFlag(True),
    "--enable-cache-dit-summary": ExtraFlag(False),
    "--stage-init-timeout": ExtraFlag(True),
    "--init-timeout": ExtraFlag(True),
    "--enable-sleep-mode": ExtraFlag(False),
    "--dtype": ExtraFlag(True, choices=("auto", "bfloat16", "float16")),
    "--diffusion-compile-granularity": ExtraFlag(True, choices=("regional", "full")),
    "--model-class-name": ExtraFlag(True),
    "--vae-fast-path": ExtraFlag(True, since=(0, 30), choices=("off", "lossless", "channels_last")),
    "--dlo-resident-layers": ExtraFlag(True, since=(0, 30)),
    "--ulysses-a2a-permute": ExtraFlag(False, since=(0, 30)),
}
