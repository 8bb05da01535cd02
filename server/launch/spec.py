"""The launch spec: what the user chose, turned into a `vllm serve MODEL --omni` command.

A LaunchSpec is a frozen value: nodes, the CLI and the supervisor build one, `validate()`
refuses what the real server would refuse or mis-handle (before any process starts, with
the setting to change), and `build()` returns argv and environment. The API key travels
in the environment, never in argv, and nothing else is added that the user did not choose.
One dataclass per concern, like vLLM's own config code.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Optional

from ...errors import LauncherError, SpecError
from ...models import WanFamily, family_for
from ..config.settings import options, setting
from . import replicas as replica_rules
from .flags import Version, check_extra_flags
from .loras import StartupLora
from .versions import DEFAULT_VERSION

# Each option set is declared once, as a Literal type; the tuples are its values for code that lists them.
ParallelMode = Literal["none", "tensor", "ulysses", "ring", "cfg", "hsdp"]
OffloadMode = Literal["none", "module", "layerwise"]
Quantization = Literal["none", "fp8"]
CacheBackend = Literal["none", "cache_dit"]
UlyssesMode = Literal["strict", "advanced_uaa"]
PARALLEL_MODES = options(ParallelMode)
OFFLOAD_MODES = options(OffloadMode)
QUANTIZATIONS = options(Quantization)
CACHE_BACKENDS = options(CacheBackend)
ULYSSES_MODES = options(UlyssesMode)

_MODE_FLAG = {"tensor": "--tensor-parallel-size", "ulysses": "--usp", "ring": "--ring",
              "cfg": "--cfg-parallel-size", "hsdp": "--hsdp-shard-size"}


@dataclass(frozen=True)
class ParallelConfig:
    """Exactly one multi-GPU mode and its degree, plus VAE patch parallel inside that world.

    `hsdp` adds FSDP2 weight sharding over the Ulysses/ring/CFG world (the configuration
    upstream's own 2xH100 baseline uses); mode "hsdp" alone is pure weight sharding.
    """

    mode: ParallelMode = setting(
        "none", "one multi-GPU mode: tensor (splits the weights: memory), ulysses (sequence parallel: speed), "
        "ring, cfg (the two guidance passes on 2 GPUs: little traffic, best without NVLink/P2P), "
        "hsdp (FSDP2 weight sharding)")
    degree: int = setting(1, "GPUs the parallel mode uses (its world size)")
    vae_patch: int = setting(1, "VAE patch parallel size: split the VAE decode over GPUs of the parallel world")
    ulysses_mode: UlyssesMode = setting(
        "strict", "strict splits the attention heads evenly (the degree must divide them: A14B 40, TI2V-5B 24); "
        "advanced_uaa allows an uneven split")
    hsdp: bool = setting(False, "also shard the weights with HSDP (FSDP2) over the ulysses/ring/cfg world")

    @property
    def world_size(self) -> int:
        return 1 if self.mode == "none" else self.degree

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.mode == "hsdp":
            out += ["--use-hsdp", "--hsdp-shard-size", str(self.degree)]
        elif self.mode != "none":
            out += [_MODE_FLAG[self.mode], str(self.degree)]
            if self.hsdp:
                out.append("--use-hsdp")
        if self.mode == "ulysses" and self.ulysses_mode != "strict":
            out += ["--ulysses-mode", self.ulysses_mode]
        if self.vae_patch > 1:
            out += ["--vae-patch-parallel-size", str(self.vae_patch)]
        return out


@dataclass(frozen=True)
class MemoryConfig:
    """How weights and activations are kept small enough for the card."""

    offload: OffloadMode = setting(
        "none", "module: the text encoder and the DiT take turns on the GPU, the other waits in CPU memory "
        "(works with every parallel mode); layerwise: DiT blocks streamed from CPU memory (one GPU only)")
    quantization: Quantization = setting("none", "fp8: FP8 DiT weights (not validated upstream for Wan2.2)")
    vae_tiling: bool = setting(False, "decode the VAE in tiles: a lower memory peak for long or large clips")
    vae_slicing: bool = setting(False, "decode the VAE one video at a time when requests are batched")

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.offload == "module":
            out.append("--enable-cpu-offload")
        elif self.offload == "layerwise":
            out.append("--enable-layerwise-offload")
        if self.quantization == "fp8":
            out += ["--quantization", "fp8"]
        if self.vae_tiling:
            out.append("--vae-use-tiling")
        if self.vae_slicing:
            out.append("--vae-use-slicing")
        return out


@dataclass(frozen=True)
class RuntimeConfig:
    """Speed and model-behaviour switches fixed for the server's lifetime."""

    cache_backend: CacheBackend = setting("none", "cache_dit: reuse DiT block outputs between steps (faster)")
    enforce_eager: bool = setting(False, "skip torch.compile: faster start, slower steps (upstream compiles)")
    boundary_ratio: Optional[float] = setting(
        None, "A14B: the fraction of the denoise run by the high-noise expert, 0..1 (T2V 0.875, I2V 0.9); "
        "set on the server it beats the request's value")
    flow_shift: Optional[float] = setting(
        None, "the scheduler's flow shift (T2V 12, I2V and TI2V 5); a request's value beats the server's")

    def flags(self) -> list[str]:
        out: list[str] = []
        if self.cache_backend != "none":
            out += ["--cache-backend", self.cache_backend]
        if self.enforce_eager:
            out.append("--enforce-eager")
        if self.boundary_ratio is not None:
            out += ["--boundary-ratio", _num(self.boundary_ratio)]
        if self.flow_shift is not None:
            out += ["--flow-shift", _num(self.flow_shift)]
        return out


@dataclass(frozen=True)
class LaunchCommand:
    """argv and the environment additions for one launch; the repr hides the key."""

    argv: list[str]
    env: dict[str, str]

    def redacted(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": {k: ("***" if k == "VLLM_API_KEY" else v) for k, v in self.env.items()}}

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
        """Raise SpecError for what must not start; return warnings for what may.

        `visible_gpus` is how many GPUs this machine shows (None: unknown, skip that check).
        """
        try:
            family = self.family
        except LauncherError as exc:
            raise SpecError(exc.what, exc.why, exc.fix, setting=exc.setting, raw=exc.raw) from exc
        p, m, r = self.parallel, self.memory, self.runtime
        _choice("parallel mode", p.mode, PARALLEL_MODES)
        _choice("offload", m.offload, OFFLOAD_MODES)
        _choice("quantization", m.quantization, QUANTIZATIONS)
        _choice("cache backend", r.cache_backend, CACHE_BACKENDS)
        _choice("ulysses mode", p.ulysses_mode, ULYSSES_MODES)
        if tuple(version) < family.min_version:
            need = ".".join(str(p) for p in family.min_version)
            raise SpecError(f"{family.label} needs vLLM-Omni {need} or newer",
                            f"the {'.'.join(str(p) for p in version)} server has no {family.pipeline_class} "
                            "pipeline in its registry (docs/wan-pipelines.md, section 1)",
                            f"install vLLM-Omni {need} into the server environment (setup), or pick another model",
                            setting="model")
        self._validate_parallel(family)
        replica_rules.check(self.replicas, family)
        self._validate_gpus(visible_gpus)
        if m.offload == "layerwise" and (p.world_size > 1 or p.vae_patch > 1):
            raise SpecError(
                "Layerwise offload cannot be combined with multi-GPU parallelism",
                "vLLM-Omni's layerwise (block-wise) offload is single-card only; upstream lists it as "
                "incompatible with sequence, CFG, tensor parallel and HSDP",
                "set offload to 'module' (works with every parallel mode), or set the parallel mode to 'none'",
                setting="offload",
            )
        if r.boundary_ratio is not None and not 0.0 <= r.boundary_ratio <= 1.0:
            raise SpecError(f"Boundary ratio {r.boundary_ratio} is out of range", "it must be within 0..1",
                            "set boundary_ratio between 0 and 1 (Wan2.2: T2V 0.875, I2V 0.9)",
                            setting="boundary_ratio")
        if r.flow_shift is not None and r.flow_shift <= 0:
            raise SpecError(f"Flow shift {r.flow_shift} must be positive", "the scheduler shift divides time steps",
                            "set flow_shift > 0 (Wan2.2: T2V 12, I2V and TI2V 5)", setting="flow_shift")
        if self.port is not None and not 0 < self.port < 65536:
            raise SpecError(f"Port {self.port} is not a TCP port", "ports are 1..65535",
                            "leave the port empty to pick a free one", setting="port")
        check_extra_flags(self.extra_flags, version)
        self.lora.validate(family, version)
        warnings = []
        if m.quantization == "fp8":
            warnings.append("FP8 for Wan2.2 is not validated upstream (vLLM-Omni's feature table marks "
                            "Wan2.2 quantization unsupported); compare quality against bf16.")
        if r.boundary_ratio in (0.0, 1.0) and family.experts == 2:
            warnings.append(f"boundary_ratio {r.boundary_ratio:g} loads only one A14B expert: less memory, "
                            "lower quality.")
        return warnings

    def _validate_parallel(self, family: WanFamily) -> None:
        p = self.parallel
        if p.mode == "none":
            if p.degree != 1:
                raise SpecError(f"Parallel degree {p.degree} needs a parallel mode",
                                "with mode 'none' the server runs on one GPU",
                                "pick a parallel mode (ulysses, cfg, ...) or set the degree to 1",
                                setting="parallel_degree")
            if p.hsdp:
                raise SpecError("HSDP on top of no parallel mode has nothing to shard over",
                                "HSDP overlays the Ulysses/ring/CFG world",
                                "choose parallel mode 'hsdp' with a degree instead", setting="parallel_mode")
        elif p.degree < 2:
            raise SpecError(f"Parallel mode '{p.mode}' with degree {p.degree} does nothing",
                            "a parallel mode splits work over at least 2 GPUs",
                            "set the degree to 2 or more, or the mode to 'none'", setting="parallel_degree")
        if p.mode == "cfg" and p.degree != 2:
            raise SpecError(f"CFG parallel degree {p.degree} is not 2",
                            "classifier-free guidance has exactly two passes (positive and negative), "
                            "so upstream can use only 2 ranks for it",
                            "set the degree to 2, or use ulysses/ring for more GPUs", setting="parallel_degree")
        if p.hsdp and p.mode == "tensor":
            raise SpecError("HSDP (FSDP2) is not compatible with TP",
                            "upstream refuses tensor parallel together with HSDP weight sharding",
                            "use HSDP with ulysses/ring/cfg, or tensor parallel without HSDP", setting="parallel_mode")
        if p.mode == "ulysses" and p.ulysses_mode == "strict" and family.attention_heads % p.degree:
            ok = [d for d in range(2, 9) if family.attention_heads % d == 0]
            raise SpecError(
                f"Ulysses degree {p.degree} does not divide {family.label}'s {family.attention_heads} attention heads",
                "strict Ulysses splits the heads evenly across GPUs",
                f"use a degree in {ok}, or set ulysses mode to 'advanced_uaa' (uneven split)",
                setting="parallel_degree")
        if p.vae_patch < 1 or (p.vae_patch > 1 and (p.vae_patch > p.world_size or p.world_size % p.vae_patch)):
            raise SpecError(
                f"VAE patch parallel {p.vae_patch} does not fit a world of {p.world_size} GPU(s)",
                "VAE patch parallel runs inside the DiT's parallel world; it cannot add GPUs",
                f"set VAE patch parallel to 1 or to a divisor of {p.world_size}", setting="vae_patch_parallel")

    def _validate_gpus(self, visible_gpus: Optional[int]) -> None:
        world, need = self.parallel.world_size, self.gpu_count
        layout = f"world size = {self.parallel.mode} degree {self.parallel.degree}"
        if self.replicas > 1:
            layout = f"{self.replicas} replicas x {world} GPU(s) each ({layout})"
        if self.gpus is not None:
            if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus) or not self.gpus:
                raise SpecError(f"GPU list {list(self.gpus)} is not valid", "ids must be distinct and >= 0",
                                "write GPU ids like '0' or '0,1', or 'all'", setting="gpus")
            if need > len(self.gpus):
                raise SpecError(
                    f"The parallel config needs {need} GPUs but {len(self.gpus)} are selected",
                    f"{layout}; upstream would fail with 'Stage 0 requires {world} device(s)'",
                    f"select {need} GPUs, or lower the parallel degree or the replicas", setting="gpus")
            if need < len(self.gpus):
                per = "" if self.replicas == 1 else f" per replica ({len(self.gpus)} / {self.replicas})"
                raise SpecError(
                    f"{len(self.gpus)} GPUs are selected but the parallel config uses {need}",
                    f"{layout}; upstream would leave the extra GPUs idle",
                    f"pick a {len(self.gpus) // self.replicas}-way parallel mode{per} (cfg for 2 GPUs with CFG "
                    f"on, ulysses for speed, tensor/hsdp for memory), raise replicas to "
                    f"{len(self.gpus) // world} for more videos at once, or select {need} GPU(s)",
                    setting="parallel_mode")
            if visible_gpus is not None and max(self.gpus) >= visible_gpus:
                raise SpecError(f"GPU {max(self.gpus)} does not exist", f"this machine shows {visible_gpus} GPU(s)",
                                f"use ids 0..{visible_gpus - 1}", setting="gpus")
        elif visible_gpus is not None and need > visible_gpus:
            raise SpecError(
                f"The parallel config needs {need} GPUs but this machine shows {visible_gpus}",
                f"{layout}; upstream would fail with 'Stage 0 requires {world} device(s)'",
                f"lower the parallel degree or the replicas to fit {visible_gpus} GPU(s)",
                setting="replicas" if self.replicas > 1 else "parallel_degree")

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
        argv = [*executable, "serve", self.model, *self.flags(), "--host", self.host, "--port", str(port)]
        if trust_remote_code:
            argv.append("--trust-remote-code")
        env: dict[str, str] = {}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.gpus)
        if api_key:
            env["VLLM_API_KEY"] = api_key
        return LaunchCommand(argv, env)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(f"Unknown {name} '{value}'", f"allowed: {', '.join(allowed)}",
                        f"set {name} to one of {', '.join(allowed)}", setting=name.replace(" ", "_"))


def _num(value: float) -> str:
    return f"{value:g}"


def parse_gpus(text: str) -> Optional[tuple[int, ...]]:
    """'all' or '' -> None (every visible GPU); '0,1' -> (0, 1)."""
    text = text.strip().lower()
    if text in ("", "all", "auto"):
        return None
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError as exc:
        raise SpecError(f"GPU list '{text}' is not valid", "expected comma-separated ids",
                        "write '0', '0,1' or 'all'", setting="gpus") from exc


def parse_parallel(text: str) -> tuple[str, int]:
    """'ulysses=2' -> ('ulysses', 2); 'none' -> ('none', 1). Aliases: tp, usp, sp, cfg."""
    aliases = {"tp": "tensor", "usp": "ulysses", "sp": "ulysses", "cfg_parallel": "cfg", "": "none"}
    name, _, degree = text.strip().lower().partition("=")
    mode = aliases.get(name, name)
    _choice("parallel mode", mode, PARALLEL_MODES)
    try:
        return mode, int(degree) if degree else (1 if mode == "none" else 2)
    except ValueError as exc:
        raise SpecError(f"Parallel degree '{degree}' is not a number", "expected MODE=N",
                        "write e.g. ulysses=2", setting="parallel") from exc
