"""Knowledge about `vllm serve --omni` flags that is not in the launch spec's fields, and the check
of a spec's extra flags against it (`check_extra_flags`).

Tables, each checked against the real 0.30 parser by the contract tests:
- flags from blog posts that do not exist, with what to use instead;
- flags blog posts use that exist but do not do what they say, or only in some versions (one
  text per case, true for the server version the spec is checked against);
- flags a workflow must never set (they come from the local machine's configuration);
- extra flags a user may add, with the oldest vLLM-Omni version that has each.
The README's table "Flags from blog posts that do not exist" says the same, flag by flag.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...errors import SpecError
from ...errors.config_names import env_var

Version = tuple[int, int]

# Flags that blog posts advertise but neither 0.26 nor 0.30 has: the real parser exits with
# "unrecognized arguments" (docs/upstream-facts.md, "Flags that do not exist"). Each value is the
# fix, a sentence that follows "remove it; ".
NONEXISTENT_FLAGS: dict[str, str] = {
    "--model-type": "nothing replaces it: the pipeline comes from the model's model_index.json (to force one, "
                    "add --model-class-name=WanPipeline or --model-class-name=WanImageToVideoPipeline)",
    "--mm-cache-capacity": "nothing replaces it for Wan (vLLM's --mm-processor-cache-gb is unrelated)",
    "--no-enable-paged-attention": "nothing replaces it: Wan runs dense attention by default",
    "--enable-gradient-checkpointing": "nothing replaces it: it is a training option, not a serving flag",
    "--max-num-batched-requests": "batch with --max-num-seqs=N and --request-batch-max-wait-ms=MS instead",
}


@dataclass(frozen=True)
class MisleadingFlag:
    """A flag the real parser has (in some versions) that a spec must not carry anyway."""

    since_gone: "Version | None"   # the first version without it (None: every supported version has it)
    present: tuple[str, str, str]  # what, why, fix where the server version has it
    gone: tuple[str, str, str] = ("", "", "")   # what, why, fix where it does not

    def text(self, version: "Version") -> tuple[str, str, str]:
        return self.gone if self.since_gone is not None and version >= self.since_gone else self.present


MISLEADING_FLAGS: dict[str, MisleadingFlag] = {
    "--num-gpus": MisleadingFlag(None, (
        "Flag --num-gpus does nothing in vLLM-Omni",
        "the real `vllm serve --omni` accepts it and ignores it: the server still runs on one GPU (world size 1)",
        "remove it; choose a parallel mode and degree instead (parallel mode ulysses with degree 2, or "
        "--parallel ulysses=2)")),
    "--stage-configs-path": MisleadingFlag((0, 30), present=(
        "Flag --stage-configs-path cannot be an extra flag",
        "vLLM-Omni 0.26 has it (deprecated), but it names a stage-config file, which a workflow must not choose, "
        "and the launcher configures the stages with CLI flags itself",
        "remove it; set what the file would set with the launcher's settings (parallel mode, offload, VAE tiling)"),
        gone=("Flag --stage-configs-path was removed in vLLM-Omni 0.30",
              "the server environment runs 0.30, whose parser exits with 'unrecognized arguments: "
              "--stage-configs-path'",
              "remove it; the launcher configures the stages with CLI flags (its settings: parallel mode, offload, "
              "VAE tiling)")),
}

# Flags only the local machine's configuration may decide, never a workflow or extra flag.
LOCAL_ONLY_FLAGS: dict[str, str] = {
    "--host": f"the bind host (set {env_var('host')} or 'host' in the local config file)",
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

# Flags a launch spec setting produces: set the setting, not the flag (it is validated with the rest).
OWNED_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "parallel mode 'tensor'", "-tp": "parallel mode 'tensor'",
    "--usp": "parallel mode 'ulysses'", "--ulysses-degree": "parallel mode 'ulysses'",
    "--ring": "parallel mode 'ring'", "--ring-degree": "parallel mode 'ring'",
    "--cfg-parallel-size": "parallel mode 'cfg'", "--use-hsdp": "parallel mode 'hsdp'",
    "--hsdp-shard-size": "parallel mode 'hsdp'", "--vae-patch-parallel-size": "VAE patch parallel",
    "--enable-cpu-offload": "offload 'module'", "--enable-layerwise-offload": "offload 'layerwise'",
    "--quantization": "quantization 'fp8'", "-q": "quantization 'fp8'",
    "--vae-use-tiling": "VAE tiling", "--vae-use-slicing": "VAE slicing",
    "--cache-backend": "cache backend", "--enforce-eager": "compile off (enforce eager)",
    "--boundary-ratio": "boundary ratio", "--flow-shift": "flow shift",
    "--served-model-name": "served model name", "--ulysses-mode": "ulysses mode",
    "--stage-overrides": "replicas (the launcher writes the stage override for them)",
    "--omni-dp-size-local": "replicas (on one machine: the launcher's replicas setting)",
}

# The first vLLM-Omni line whose Wan2.2 pipelines declare request batching (supports_request_batch):
# on 0.26 a --max-num-seqs above 1 makes the engine refuse to start ("... does not support
# request-level batching. Use max_num_seqs=1 ...", diffusion_engine.py).
WAN_BATCHING_SINCE: Version = (0, 30)


def check_extra_flags(extra_flags: Sequence[str], version: Version) -> None:
    """Refuse an extra flag that does not exist, that only the local machine may set, that a launcher
    setting owns, that is not allow-listed, or that this server version lacks; check its value."""
    args = list(extra_flags)
    i = 0
    while i < len(args):
        raw = args[i]
        name, has_inline = raw.split("=", 1)[0], "=" in raw
        if name in NONEXISTENT_FLAGS:
            raise SpecError(f"Flag {name} does not exist in vLLM-Omni",
                            "it comes from blog posts; the real `vllm serve --omni` (0.26 and 0.30) exits with "
                            f"'unrecognized arguments: {name}'",
                            f"remove it; {NONEXISTENT_FLAGS[name]}", setting="extra_flags")
        if name in MISLEADING_FLAGS:
            what, why, fix = MISLEADING_FLAGS[name].text(version)
            raise SpecError(what, why, fix, setting="extra_flags")
        if name in LOCAL_ONLY_FLAGS:
            raise SpecError(f"Flag {name} cannot be set from a workflow",
                            "a shared workflow must not choose network exposure, keys or remote code",
                            f"remove it; {LOCAL_ONLY_FLAGS[name]}", setting="extra_flags")
        if name in OWNED_FLAGS:
            raise SpecError(f"Flag {name} is a launcher setting", "the launcher validates it with the rest",
                            f"remove it and set {OWNED_FLAGS[name]} instead", setting="extra_flags")
        spec = EXTRA_FLAGS.get(name)
        if spec is None:
            raise SpecError(f"Flag {name} is not on the launcher's allow-list",
                            "extra flags are limited to ones checked against the real parser",
                            "use one of: " + ", ".join(sorted(EXTRA_FLAGS)), setting="extra_flags")
        if version < spec.since:
            raise SpecError(f"Flag {name} needs vLLM-Omni {spec.since[0]}.{spec.since[1]} or newer",
                            f"the server environment runs {version[0]}.{version[1]}",
                            f"remove {name}, or upgrade the server environment", setting="extra_flags")
        if spec.takes_value:
            if has_inline:
                value = raw.split("=", 1)[1]
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                i += 1
                value = args[i]
            else:
                # What follows is a flag (`--api-key=x`, `-q`): it is never taken as this one's value, so it
                # is checked as a flag itself and cannot slip past the tables above.
                raise SpecError(f"Flag {name} needs a value", "it is not a switch"
                                + (f", and {args[i + 1]} after it is a flag, not its value" if i + 1 < len(args)
                                   else ""), f"write it as {name}=VALUE", setting="extra_flags")
            if spec.choices and value not in spec.choices:
                raise SpecError(f"{name} {value} is not valid", f"allowed: {', '.join(spec.choices)}",
                                f"use {name}={spec.choices[0]}", setting="extra_flags")
            if name == "--max-num-seqs":
                _check_batch_width(value, version)
        elif has_inline:
            raise SpecError(f"Flag {name} takes no value", "it is a switch", f"write it as {name}",
                            setting="extra_flags")
        i += 1


def batch_width(extra_flags: tuple[str, ...]) -> int:
    """--max-num-seqs in `extra_flags` ("--max-num-seqs=2" or "--max-num-seqs", "2"); 1 without it (a value that is
    no whole number is refused by check_extra_flags before any launch)."""
    args = list(extra_flags)
    for i, arg in enumerate(args):
        name, _, value = arg.partition("=")
        if name == "--max-num-seqs":
            text = value if "=" in arg else (args[i + 1] if i + 1 < len(args) else "1")
            try:
                return int(text)
            except ValueError:
                return 1          # check_extra_flags refuses it before any launch
    return 1


def _check_batch_width(value: str, version: Version) -> None:
    """--max-num-seqs is a whole number >= 1, and above 1 only where the Wan pipelines can batch."""
    try:
        width = int(value)
    except ValueError:
        width = 0
    if width < 1:
        raise SpecError(f"--max-num-seqs {value} is not valid", "it is the number of requests one forward "
                        "may carry, a whole number >= 1", "write e.g. --max-num-seqs=2", setting="extra_flags")
    if width > 1 and version < WAN_BATCHING_SINCE:
        since = ".".join(map(str, WAN_BATCHING_SINCE))
        raise SpecError(f"--max-num-seqs {width} needs vLLM-Omni {since} or newer for Wan2.2",
                        f"the server environment runs {version[0]}.{version[1]}, whose Wan pipelines do not "
                        "support request batching: the engine refuses to start with max_num_seqs > 1",
                        f"remove --max-num-seqs (or set it to 1), or upgrade the server environment to {since} "
                        "(python -m vllm_omni_launcher setup)", setting="extra_flags")
