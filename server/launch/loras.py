"""LoRAs: the entries a user picked, and how the server applies each one (fused at start, or per request).

Upstream facts (checked in the vLLM-Omni 0.30 wheel; 0.26 has no startup LoRA at all):

* Startup, 0.30: `--lora-backend distill --lora-path F [F2]` (`entrypoints/cli/serve.py`,
  `diffusion/worker/diffusion_worker.py`, `diffusion/lora/loader.py: WanLoraLoaderMixin`) fuses
  one concrete `.safetensors` file per pipeline transformer, matched by position: TI2V-5B takes
  one file, A14B exactly two (`transformer` = high-noise expert first, `transformer_2` = low-noise
  second). ComfyUI / original-Wan keys (`diffusion_model.*`, lora_down/lora_up/alpha) are
  converted by diffusers' Wan converter; Diffusers keys load as they are. The file is fused at
  its own scale: `--lora-scale` does not apply to distill (the loader adds B@A unscaled), so
  another strength is served by fusing a scaled copy of the file (server/launch/lora_files.py). A
  PEFT folder does not load there. Fused weights are part of the server, so a change (of a
  file or a strength) means a new server (they are in the LaunchSpec, hence in its fingerprint).
* Startup, 0.30: `--lora-backend peft --lora-path DIR` only pre-loads an adapter: every request
  without a `lora` field switches all adapters off again (`set_active_adapter(None)`), so the
  launcher never uses it.
* Per request, 0.26 and 0.30: the `lora` form field `{"name", "path", "scale"}` names one PEFT
  folder (adapter_config.json + adapter_model.safetensors) on the server's disk, at any scale.
  One adapter per request; upstream never batches requests with different adapters. Its module
  names decide where it binds: names relative to the transformer (`blocks.0.attn2.to_q`, what
  peft writes for a WanTransformer3DModel) bind in both A14B experts.

So: single files are fused at startup (0.30), PEFT folders go per request; what neither can
express is refused here with the fix, before anything starts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal, Optional, Sequence

from ...client.request import RequestLora
from ...errors import LauncherError, SpecError
from ...models import WanFamily, family_for
from ..config.local_config import load_local_config
from ..config.settings import options, setting
from .flags import Version
from .lora_files import read_header, scaled_lora, unscalable

Expert = Literal["both", "high_noise", "low_noise"]
EXPERTS = options(Expert)
LoraFormat = Literal["file", "peft"]
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
STARTUP_SINCE: Version = (0, 30)
MAX_STRENGTH = 10.0


@dataclass(frozen=True)
class LoraEntry:
    """One LoRA as chosen: its path on this machine, its strength, and (A14B) which expert it is for."""

    path: str
    strength: float = 1.0
    expert: Expert = "both"
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or Path(self.path).name

    @property
    def format(self) -> LoraFormat:
        return lora_format(Path(self.path))


@dataclass(frozen=True)
class StartupLora:
    """LoRA files fused into the model when the server starts (vLLM-Omni 0.30's distill backend)."""

    lora_paths: tuple[str, ...] = setting(
        (), "LoRA .safetensors files fused at startup, one per transformer (A14B: high-noise, then low-noise)")

    def flags(self) -> list[str]:
        return ["--lora-backend", "distill", "--lora-path", *self.lora_paths] if self.lora_paths else []

    def validate(self, family: WanFamily, version: Version) -> None:
        """Refuse what the server would refuse or silently mis-apply."""
        if not self.lora_paths:
            return
        if version < STARTUP_SINCE:
            raise SpecError(
                f"vLLM-Omni {version[0]}.{version[1]} cannot fuse LoRAs at startup",
                "startup LoRA (--lora-path) is new in 0.30; 0.26 has only the per-request PEFT adapter",
                "use a PEFT LoRA folder (applied per request), or upgrade the server environment to 0.30",
                setting="lora_name")
        if len(self.lora_paths) != family.experts:
            raise SpecError(
                f"{family.label} needs {family.experts} fused LoRA file(s), got {len(self.lora_paths)}",
                "the distill backend matches one file to each transformer by position",
                "give one LoRA for TI2V-5B; for A14B one high-noise and one low-noise LoRA, or one for both",
                setting="lora_name")


@dataclass(frozen=True)
class LoraPlan:
    """How a set of entries is served: fused at startup, per request, and what to tell the user."""

    startup: StartupLora = field(default_factory=StartupLora)
    per_request: Optional[RequestLora] = None
    notes: tuple[str, ...] = ()


def lora_format(path: Path) -> LoraFormat:
    """'peft' for a PEFT folder, 'file' for a .safetensors file; LauncherError for anything else."""
    if not path.exists():
        raise LauncherError(f"LoRA '{path}' does not exist", "the path names no file or folder",
                            "check the path (LoRAs live in ComfyUI/models/loras)", setting="lora_name")
    if path.is_dir() and (path / PEFT_CONFIG).is_file() and (path / PEFT_WEIGHTS).is_file():
        return "peft"
    if path.is_file() and path.suffix == ".safetensors":
        return "file"
    raise LauncherError(
        f"LoRA '{path.name}' is neither a .safetensors file nor a PEFT folder",
        f"vLLM-Omni loads a single .safetensors file (fused at startup) or a folder with {PEFT_CONFIG} and "
        f"{PEFT_WEIGHTS} (per request)", "pick another LoRA, or convert this one to .safetensors",
        setting="lora_name")


def plan_loras(entries: Sequence[LoraEntry], family: WanFamily, version: Version,
               data_dir: Optional[str] = None) -> LoraPlan:
    """Decide how `entries` are served by a server of `version` for `family`. Raises LauncherError
    (naming the LoRA widget) where no way exists. A fused LoRA at a strength other than 1 is
    served from a scaled copy, made here in `data_dir` (None: the local config's)."""
    if not entries:
        return LoraPlan()
    for e in entries:
        if not 0.0 < float(e.strength) <= MAX_STRENGTH:
            raise LauncherError(f"LoRA '{e.name}' strength {e.strength:g} is out of range",
                                f"strengths are above 0 and at most {MAX_STRENGTH:g} (0 would switch it off)",
                                "set strength to 1.0 (distill LoRAs) or 0.5-3", setting="strength")
    formats = {e.format for e in entries}
    if formats == {"peft"}:
        return _per_request(entries, family)
    if formats == {"file"}:
        return _fused(entries, family, version, data_dir)
    raise LauncherError(
        "PEFT folders and single-file LoRAs cannot be combined",
        "single files are fused into the model at startup, PEFT folders are applied per request, and the "
        "launcher does not mix the two on one server",
        "use only .safetensors files (fused) or a single PEFT folder", setting="lora_name")


def _per_request(entries: Sequence[LoraEntry], family: WanFamily) -> LoraPlan:
    if len(entries) > 1:
        raise LauncherError(
            f"{len(entries)} PEFT LoRAs are chained, vLLM-Omni applies one per request",
            "a request's `lora` field names exactly one adapter",
            "keep one PEFT LoRA node, or merge the adapters into one folder", setting="lora_name")
    e = entries[0]
    if family.experts == 2 and e.expert != "both":
        raise LauncherError(
            f"A PEFT LoRA cannot be limited to the {e.expert.replace('_', '-')} expert",
            "a per-request adapter binds wherever its module names match, which for adapters made on "
            "the transformer is both A14B experts",
            "set expert to both, or use single-file LoRAs (fused per expert at startup)", setting="expert")
    lora = RequestLora(name=e.name, path=str(Path(e.path).resolve()), scale=float(e.strength))
    gib = adapter_gpu_gib(lora, family)
    return LoraPlan(per_request=lora, notes=(f"LoRA {e.name} x{e.strength:g}: per request (no restart; about "
                                             f"{gib:.2f} GiB more per GPU once used)",))


def _fused(entries: Sequence[LoraEntry], family: WanFamily, version: Version, data_dir: Optional[str]) -> LoraPlan:
    if version < STARTUP_SINCE:
        raise LauncherError(
            f"vLLM-Omni {version[0]}.{version[1]} cannot load single-file LoRAs",
            "0.26 has only the per-request LoRA, which loads PEFT folders; fusing a .safetensors LoRA at "
            "startup is new in 0.30", "upgrade the server environment to vLLM-Omni 0.30, or use a PEFT folder",
            setting="lora_name")
    _paths_by_expert(entries, family, [e.path for e in entries])          # refuse a bad set before any copy
    files = [e.path if float(e.strength) == 1.0 else
             str(scaled_lora(Path(e.path).resolve(), float(e.strength), data_dir or load_local_config().data_dir))
             for e in entries]
    paths = _paths_by_expert(entries, family, files)
    names = ", ".join((f"{e.name} ({e.expert.replace('_', '-')})" if family.experts == 2 else e.name)
                      + (f" x{e.strength:g} (a scaled copy)" if float(e.strength) != 1.0 else "") for e in entries)
    return LoraPlan(startup=StartupLora(tuple(paths)), notes=(f"LoRA {names}: fused at startup",))


def _paths_by_expert(entries: Sequence[LoraEntry], family: WanFamily, files: Sequence[str]) -> list[str]:
    """One of `files` (entry i's file to fuse) per transformer, in upstream's order (high-noise, low-noise)."""
    paths = [str(Path(f).resolve()) for f in files]
    if family.experts == 1:
        if len(entries) != 1:
            raise LauncherError(f"{len(entries)} LoRA files chained for {family.label}",
                                "the fused (distill) loader takes one file for the one transformer",
                                "keep one LoRA node", setting="lora_name")
        return paths
    slots: dict[str, str] = {}
    for e, path in zip(entries, paths):
        for slot in (("high_noise", "low_noise") if e.expert == "both" else (e.expert,)):
            if slot in slots:
                raise LauncherError(
                    f"Two fused LoRAs for the {slot.replace('_', '-')} expert",
                    "the fused (distill) loader takes exactly one file per expert",
                    "set expert to high_noise on one LoRA and low_noise on the other", setting="expert")
            slots[slot] = path
    missing = [s for s in ("high_noise", "low_noise") if s not in slots]
    if missing:
        raise LauncherError(
            f"No fused LoRA for the {missing[0].replace('_', '-')} expert",
            "vLLM-Omni's fused (distill) loader needs one file for each A14B expert",
            f"add a LoRA node with expert {missing[0]}, or set the one LoRA's expert to both", setting="expert")
    return [slots["high_noise"], slots["low_noise"]]


# ----------------------------------------------------------------------------- finding LoRAs on disk
def find_loras(roots: Iterable[Path]) -> dict[str, Path]:
    """Every LoRA under `roots` by its list name: .safetensors files by relative path (ComfyUI's
    own names) and PEFT folders by relative path with a trailing '/'. A PEFT folder's own weights
    file is not listed again. The first root wins for a name found twice."""
    found: dict[str, Path] = {}
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            continue
        visited: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in visited:
                dirnames[:] = []
                continue
            visited.add(real)
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            folder = Path(dirpath)
            relative = folder.relative_to(root).as_posix()
            if PEFT_CONFIG in filenames and PEFT_WEIGHTS in filenames:
                found.setdefault((relative if relative != "." else folder.name) + "/", folder)
                dirnames[:] = []
                continue
            for name in sorted(filenames):
                if name.endswith(".safetensors"):
                    found.setdefault(name if relative == "." else f"{relative}/{name}", folder / name)
    return found


def serving_note(path: Path, version: Version) -> tuple[bool, str]:
    """(servable, how) for one LoRA found on disk, on a server of `version` (the Doctor's line)."""
    try:
        fmt = lora_format(path)
    except LauncherError as exc:
        return False, exc.what
    if fmt == "peft":
        return True, "PEFT folder: applied per request (any strength)"
    if version < STARTUP_SINCE:
        return False, (f"single file: vLLM-Omni {version[0]}.{version[1]} cannot load it (fusing at startup is "
                       "new in 0.30; convert it to a PEFT folder or upgrade)")
    try:
        why = unscalable(read_header(path))
    except LauncherError as exc:
        return False, f"single file: {exc.what} ({exc.why})"
    strengths = "strength 1.0 only: " + why if why else "any strength; other than 1.0 from a scaled copy"
    return True, f"single file: fused at startup ({strengths}; a change restarts the server)"


def adapter_gpu_gib(lora: RequestLora, family: WanFamily) -> float:
    """GPU memory of a per-request PEFT adapter: its A/B matrices in bf16, in every expert it binds
    (names without a `transformer.` / `transformer_2.` component bind in each A14B expert). Read
    from the safetensors header only."""
    header = read_header(Path(lora.path) / PEFT_WEIGHTS)
    numel, scoped = 0, True
    for name, info in header.tensors.items():
        count = 1
        for dim in info.get("shape", ()):
            count *= int(dim)
        numel += count
        module = name.removeprefix("base_model.model.")
        scoped = scoped and module.startswith(("transformer.", "transformer_2."))
    experts = 1 if scoped else family.experts
    return numel * 2 * experts / 2**30


def parse_cli_loras(values: Sequence[str], experts: Sequence[str], family: WanFamily) -> list[LoraEntry]:
    """`--lora PATH[:STRENGTH]` (repeatable) and `--lora-expert` (one per --lora, optional) as entries.
    For A14B without --lora-expert the first is the high-noise and the second the low-noise LoRA;
    a single one applies to both."""
    if experts and len(experts) != len(values):
        raise LauncherError(f"{len(experts)} --lora-expert for {len(values)} --lora",
                            "each --lora-expert belongs to the --lora at the same position",
                            "give one --lora-expert per --lora, or none", setting="lora_expert")
    entries = []
    for i, value in enumerate(values):
        path, strength = value, 1.0
        head, sep, tail = value.rpartition(":")
        if sep and head:
            try:
                strength = float(tail)
                path = head
            except ValueError:
                pass        # a ':' inside the path itself
        if experts:
            expert = experts[i]
        elif family.experts == 2 and len(values) == 2:
            expert = ("high_noise", "low_noise")[i]
        else:
            expert = "both"
        if expert not in EXPERTS:
            raise LauncherError(f"LoRA expert '{expert}' is not known", f"allowed: {', '.join(EXPERTS)}",
                                "use --lora-expert high_noise, low_noise or both", setting="lora_expert")
        p = Path(path).expanduser()
        lora_format(p)      # refuses a missing or unknown path now, naming it
        entries.append(LoraEntry(str(p.resolve()), strength, expert, p.name))  # type: ignore[arg-type]
    return entries


def startup_from_cli(values: Sequence[str], experts: Sequence[str], model: str) -> StartupLora:
    """The fused LoRAs of the launch options `--lora` / `--lora-expert` (argv, serve, generate --model).
    A PEFT folder is refused there: it is applied per request (`generate --lora-request`)."""
    if not values:
        return StartupLora()
    family = family_for(model)
    entries = parse_cli_loras(values, experts, family)
    folders = [e.name for e in entries if e.format == "peft"]
    if folders:
        raise LauncherError(
            f"--lora {folders[0]} is a PEFT folder", "--lora fuses single-file LoRAs when the server starts; "
            "vLLM-Omni applies PEFT folders per request", "pass the folder to `generate --lora-request "
            "DIR[:STRENGTH]` instead", setting="lora")
    return plan_loras(entries, family, STARTUP_SINCE).startup


def request_lora_from_cli(value: str, family: WanFamily) -> RequestLora:
    """`generate --lora-request DIR[:STRENGTH]`: a PEFT folder applied to this one request. The path
    is the server's (for --url on another machine: where the folder is there)."""
    (entry,) = parse_cli_loras([value], [], family)
    if entry.format != "peft":
        raise LauncherError(
            f"--lora-request {entry.name} is not a PEFT folder", "vLLM-Omni applies only PEFT folders "
            "(adapter_config.json + adapter_model.safetensors) per request",
            "pass a single .safetensors file with --lora (fused when the server starts) instead",
            setting="lora_request")
    plan = plan_loras([entry], family, STARTUP_SINCE)
    assert plan.per_request is not None
    return plan.per_request


__all__ = ["EXPERTS", "Expert", "LoraEntry", "LoraPlan", "MAX_STRENGTH", "STARTUP_SINCE", "StartupLora", "find_loras",
           "adapter_gpu_gib", "lora_format", "parse_cli_loras", "serving_note", "plan_loras", "request_lora_from_cli", "startup_from_cli"]
