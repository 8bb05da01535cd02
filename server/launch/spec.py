"""The launch spec: what the user chose, turned into a `vllm serve MODEL --omni` command.

A LaunchSpec is a frozen value: nodes, the CLI and the supervisor build one, `validate()`
refuses what the real server would refuse or mis-handle (before any process starts, with
the setting to change), and `build()` returns argv and environment. The API key travels
in the environment, never in argv, and nothing else is added that the user did not choose.
One dataclass per concern, like vLLM's own config code.

This module owns the spec's identity (fields, fingerprint, dict form), the whole command
(argv and environment) and the text parsers for GPUs and parallel modes. The sections and
their flags are sections.py's, the refusals spec_rules.py's; the section types are
re-exported here, so `launch.spec` stays the one place importers take a spec's parts from.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from ...errors import LauncherError, SpecError
from ...models import WanFamily, family_for
from ..config.config_values import shown
from ..config.settings import setting
from . import replicas as replica_rules
from . import spec_rules as rules
from .flags import Version, check_extra_flags
from .loras import StartupLora
from .sections import (CACHE_BACKENDS, OFFLOAD_MODES, PARALLEL_MODES, QUANTIZATIONS, ULYSSES_MODES, CacheBackend,
                       MemoryConfig, OffloadMode, ParallelConfig, ParallelMode, Quantization, RuntimeConfig,
                       UlyssesMode)
from .versions import DEFAULT_VERSION

__all__ = ["CACHE_BACKENDS", "DEFAULT_VERSION", "OFFLOAD_MODES", "PARALLEL_MODES", "QUANTIZATIONS", "ULYSSES_MODES",
           "CacheBackend", "LaunchCommand", "LaunchSpec", "MemoryConfig", "OffloadMode", "ParallelConfig",
           "ParallelMode", "Quantization", "RuntimeConfig", "UlyssesMode", "parse_gpus", "parse_parallel", "MAX_GPUS"]

# More GPUs than one machine holds (the largest NVSwitch systems have 16 to 72): an id list, a count or a
# size list above it is a typo or a hostile workflow, refused before any list is built.
MAX_GPUS = 128


@dataclass(frozen=True)
class LaunchCommand:
    """argv and the environment additions for one launch; the repr hides the key."""

    argv: list[str]
    env: dict[str, str]

    def redacted(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": {k: ("***" if k == "VLLM_API_KEY" else v) for k, v in self.env.items()}}

    def shell(self) -> str:
        """The command as one line to paste into a shell: the (redacted) environment, then the argv, every word
        quoted (a replica layout's --stage-overrides is JSON), so the pasted line runs exactly this argv."""
        shown = self.redacted()
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown["env"].items())
        return (env + " " if env else "") + shlex.join(shown["argv"])

    def __repr__(self) -> str:
        return f"LaunchCommand({self.redacted()!r})"


@dataclass(frozen=True)
class LaunchSpec:
    """One server: model, GPUs, parallelism, memory, runtime switches and network."""

    model: str = setting(help="HF id (Wan-AI/Wan2.2-T2V-A14B-Diffusers, ...-I2V-A14B-..., "
                              "...-TI2V-5B-...) or a local Diffusers folder")
    gpus: Optional[tuple[int, ...]] = setting(None, "GPU ids to run on; unset: every visible GPU, of which "
                                                    "the first world-size ones are used")
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    replicas: int = setting(1, "copies of the parallel layout, each on its own GPUs (GPUs = replicas x the "
                               "layout's); upstream sends each job to one copy: more videos per hour, not a "
                               "faster video (T2V-A14B and TI2V-5B)", min=1, max=replica_rules.MAX_REPLICAS)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    lora: StartupLora = field(default_factory=StartupLora)
    served_model_name: Optional[str] = setting(None, "the model name clients use in requests (default: the model)")
    host: str = setting("127.0.0.1", "the address to listen on; set only locally (a workflow cannot choose it)")
    port: Optional[int] = setting(None, "the TCP port to listen on; unset: a free port chosen at launch")
    extra_flags: tuple[str, ...] = setting((), "allow-listed extra `vllm serve` flags, checked against the "
                                               "launcher's flag table for the server's version")

    # ---- identity -------------------------------------------------------------------
    @property
    def family(self) -> WanFamily:
        return family_for(self.model)

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def gpu_count(self) -> int:
        """GPUs the server uses: its replicas times the parallel layout's world size."""
        return self.replicas * self.parallel.world_size

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = list(self.gpus) if self.gpus is not None else None
        data["extra_flags"] = list(self.extra_flags)
        if not self.lora.lora_paths:
            del data["lora"]          # no LoRA: the fingerprint stays what it was before LoRAs existed
        if self.replicas == 1:
            del data["replicas"]      # likewise for one replica
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "LaunchSpec":
        gpus = data.get("gpus")
        return cls(
            model=data["model"],
            gpus=tuple(int(g) for g in gpus) if gpus is not None else None,
            parallel=ParallelConfig(**data.get("parallel", {})),
            replicas=int(data.get("replicas", 1)),
            memory=MemoryConfig(**data.get("memory", {})),
            runtime=RuntimeConfig(**data.get("runtime", {})),
            lora=StartupLora(tuple(data.get("lora", {}).get("lora_paths", ()))),
            served_model_name=data.get("served_model_name"),
            host=data.get("host", "127.0.0.1"),
            port=data.get("port"),
            extra_flags=tuple(data.get("extra_flags", ())),
        )

    def fingerprint(self) -> str:
        """Stable id of everything that changes the server process (the reuse key)."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_changes(self, **changes: Any) -> "LaunchSpec":
        return replace(self, **changes)

    # ---- validation -----------------------------------------------------------------
    def validate(self, visible_gpus: Optional[int] = None, version: Version = DEFAULT_VERSION) -> list[str]:
        """Raise SpecError for what must not start; return warnings for what may (spec_rules.py).

        `visible_gpus` is how many GPUs this machine shows (None: unknown, skip that check).
        """
        try:
            family = self.family
        except LauncherError as exc:
            raise SpecError(exc.what, exc.why, exc.fix, setting=exc.setting, raw=exc.raw,
                            raw_label=exc.raw_label) from exc
        p, m, r = self.parallel, self.memory, self.runtime
        rules.check_choices(p, m, r)
        rules.check_version(family, version)
        rules.check_parallel(p, family)
        replica_rules.check(self.replicas, family)
        rules.check_gpus(self.gpus, p, self.replicas, visible_gpus)
        rules.check_values(p, m, r, self.port)
        check_extra_flags(self.extra_flags, version)
        self.lora.validate(family, version)
        return rules.warnings_for(m, r, family)

    # ---- command --------------------------------------------------------------------
    def flags(self) -> list[str]:
        """The `vllm serve` flags after the model, without host/port (those come at launch)."""
        out = ["--omni"]
        if self.served_model_name:
            out += ["--served-model-name", self.served_model_name]
        out += self.parallel.flags() + replica_rules.stage_overrides(self.replicas, self.parallel.world_size)
        out += self.memory.flags() + self.runtime.flags() + self.lora.flags() + self._family_flags()
        return out + list(self.extra_flags)

    def _family_flags(self) -> list[str]:
        """What the model's family needs on the command line (S2V's `--model-class-name`: its repo has
        no model_index.json), unless the allow-listed extra flags already say it."""
        try:
            flags = list(self.family.launch_flags)
        except LauncherError:
            return []
        return [] if flags and flags[0] in self.extra_flags else flags

    def build(self, executable: list[str], port: int, api_key: Optional[str],
              trust_remote_code: bool = False) -> LaunchCommand:
        """argv and environment for one launch.

        `executable` and `trust_remote_code` come from the local configuration, never from
        the spec (a shared workflow must not pick a program to run or allow remote code).
        """
        command = self.serve_command(executable)
        argv = [*command.argv, "--host", self.host, "--port", str(port)]
        if trust_remote_code:
            argv.append("--trust-remote-code")
        env = dict(command.env)
        if api_key:
            env["VLLM_API_KEY"] = api_key
        return LaunchCommand(argv, env)

    def serve_command(self, executable: list[str]) -> LaunchCommand:
        """`executable serve MODEL --omni FLAGS` and its CUDA_VISIBLE_DEVICES: the part of every launch's command
        the spec decides (`build` adds the address, port and key), and what a plan prints for pasting."""
        env = {} if self.gpus is None else {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)}
        return LaunchCommand([*executable, "serve", self.model, *self.flags()], env)


def parse_gpus(text: str) -> Optional[tuple[int, ...]]:
    """'all' or '' -> None (every visible GPU); '0,1' -> (0, 1). The `gpus` widget is the workflow's, so
    the ids are read one at a time and a list longer than MAX_GPUS is refused at its first id too many,
    before it is split or converted whole."""
    text = text.strip().lower()
    if text in ("", "all", "auto"):
        return None
    ids: list[int] = []
    for match in re.finditer(r"[^,]+", text):
        part = match.group().replace(" ", "")
        if not part:
            continue
        if len(ids) == MAX_GPUS:
            raise SpecError(f"gpus got {shown(text)}, which lists more than {MAX_GPUS} GPU ids",
                            f"no machine has more than {MAX_GPUS} GPUs, so a longer list is a typo or a hostile "
                            "workflow", "write the ids of the GPUs the server should use, e.g. '0,1', or 'all'",
                            setting="gpus")
        try:
            ids.append(int(part))
        except ValueError as exc:
            raise SpecError(f"gpus got {shown(text)}, which is not a GPU list", "expected comma-separated ids",
                            "write '0', '0,1' or 'all'", setting="gpus") from exc
    return tuple(ids)


def parse_parallel(text: str) -> tuple[str, int]:
    """'ulysses=2' -> ('ulysses', 2); 'none' -> ('none', 1). Aliases: tp, usp, sp, cfg."""
    aliases = {"tp": "tensor", "usp": "ulysses", "sp": "ulysses", "cfg_parallel": "cfg", "": "none"}
    name, _, degree = text.strip().lower().partition("=")
    mode = aliases.get(name, name)
    rules.choice("parallel mode", mode, PARALLEL_MODES)
    try:
        return mode, int(degree) if degree else (1 if mode == "none" else 2)
    except ValueError as exc:
        raise SpecError(f"Parallel degree '{degree}' is not a number", "expected MODE=N",
                        "write e.g. ulysses=2", setting="parallel") from exc
