"""`doctor`: check the machine before a launch, and say how to fix each problem.

Checks: the GPUs (planner/doctor_gpus.py: NVML's name, memory, driver, compute capability,
peer-to-peer access and topology between each pair, GPU memory this process (ComfyUI) holds
itself, or the sizes VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB gives, which launches use), the server
environment (planner/doctor_env.py: its python runs a short script: python, vllm, vllm-omni,
torch, CUDA, diffusers), host RAM, disk space for the model download (not on a client-only box, which
never downloads it), the model folder (a Diffusers folder, or
S2V's original layout), whether an S2V server finds its VAE config in the HF cache, and the port. Every check
that could not run says why ("unchecked"), so the report is useful on a machine with no GPU.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import LauncherError
from ..errors import failure_patterns as patterns
from ..models import FAMILIES, WanFamily, family_for, find_local_models, is_s2v_original
from ..server.config.environment import server_environment
from ..server.config.local_config import LocalConfig, load_local_config
from ..server.launch import hf_cache
from ..server.launch.loras import STARTUP_SINCE, find_loras, serving_note
from .doctor_env import check_server_env, major_minor
from .doctor_gpus import box_role, check_gpus, env_gpus, unlisted
from .doctor_report import CLIENT_ONLY, GPU_BOX, OK, PROBLEM, UNCHECKED, WARNING, Check, DoctorReport
from .gpus import GIB, NONE_FOUND, GpuInfo, open_nvml
from .gpu_memory_env import GPU_MEMORY_ENV
from .model_sizes import model_sizes


def _check_loras(roots: Sequence[Path], version: Optional[tuple[int, int]]) -> Check:
    """The LoRAs under `roots` (each file and PEFT folder, by the name the LoRA node lists) and how
    the server environment's vLLM-Omni serves each: fused at startup, per request, or not, and why
    (server/launch/loras.py `serving_note`, the rule the launch itself follows)."""
    found = find_loras(roots)
    missing = [str(r) for r in roots if not Path(r).is_dir()]
    absent = f" ({', '.join(missing)}: not a folder)" if missing else ""
    if not found:
        return Check("loras", WARNING if missing else OK, "no LoRAs under " + ", ".join(str(r) for r in roots)
                     + absent, "check the LoRA folder path" if missing else "")
    if version is None:
        return Check("loras", UNCHECKED, f"{len(found)} LoRA(s) found{absent}; the server's vLLM-Omni version is "
                     "unknown, so whether each can be served was not checked: " + ", ".join(sorted(found)),
                     "set up the server environment (`setup`), then run the doctor again",
                     details={"loras": [{"name": n, "path": str(p)} for n, p in sorted(found.items())]})
    rows = []
    for name, path in sorted(found.items()):
        servable, how = serving_note(path, version)
        rows.append({"name": name, "path": str(path), "servable": servable, "how": how})
    bad = [r for r in rows if not r["servable"]]
    fix = "" if not bad else ("upgrade the server environment to vLLM-Omni 0.30 to fuse single-file LoRAs, or "
                              "use PEFT folders" if version < STARTUP_SINCE else "replace the LoRAs marked as not servable")
    listing = "".join(f"\n  {r['name']}: {r['how']}" for r in rows)
    return Check("loras", WARNING if bad else OK, f"{len(found)} LoRA(s), vLLM-Omni {version[0]}.{version[1]}"
                 f"{absent}:{listing}", fix, details={"loras": rows})


def _server_env(config: Optional[LocalConfig]) -> dict[str, str]:
    """The Hugging Face part of the environment a launch would give the server (server/config/environment.py)."""
    return server_environment(os.environ, config or LocalConfig(), {})


def hf_cache_dir(config: Optional[LocalConfig] = None) -> Path:
    """Where `vllm serve` downloads HF repos, for the environment a launch would give it."""
    return hf_cache.hub_dir(_server_env(config))


def _check_wan_vae_config(model: Optional[str], config: LocalConfig) -> list[Check]:
    """S2V's original layout reads its VAE config from another HF repo at load: whether the server's cache
    holds it, and whether an offline server would start without it (the launch's own refusal,
    server/launch/hf_cache.py)."""
    family = _family_or_none(model)
    if not model or family is None or not hf_cache.needs_wan_vae_config(model, family):
        return []
    env = _server_env(config)
    repo, file = patterns.WAN_VAE_CONFIG_REPO, patterns.WAN_VAE_CONFIG_FILE
    found = hf_cache.cached_file(repo, file, env)
    if found:
        return [Check("s2v_vae_config", OK,
                      f"{repo} {file}, which S2V's VAE loader reads, is in the HF cache ({found})")]
    refusal = hf_cache.wan_vae_config_refusal(model, family, env)
    if refusal is not None:
        return [Check("s2v_vae_config", PROBLEM, f"{refusal.what}: {refusal.why}", refusal.fix)]
    hub = hf_cache.hub_dir(env)
    return [Check("s2v_vae_config", OK, f"{repo} {file}, which S2V's VAE loader reads, is not in the HF cache ({hub}): "
                  "the server fetches it from the Hub at load; to start offline (HF_HUB_OFFLINE=1) later, first run "
                  f"`hf download {repo} {file} --cache-dir {shlex.quote(str(hub))}`")]


def _check_model(model: Optional[str], config: LocalConfig, role: str = GPU_BOX) -> list[Check]:
    """The model folder, or for a Hugging Face id whether it is downloaded and the disk has room for it;
    on a client-only box no server runs, so nothing is downloaded here and the disk is not judged."""
    if not model:
        return [Check("model", UNCHECKED, "no model given (use --model to check a folder or the download space)")]
    path = Path(model).expanduser()
    checks: list[Check] = []
    try:
        family = family_for(model)
    except LauncherError as exc:
        return [Check("model", PROBLEM, exc.what, exc.fix)]
    if path.is_dir() and is_s2v_original(path):
        return [_check_s2v_folder(path, family)]
    if path.is_dir():
        parts = ["transformer", "text_encoder", "tokenizer", "vae", "scheduler"]
        if family.experts == 2:
            parts.insert(1, "transformer_2")
        missing = [p for p in parts if not (path / p).is_dir()]
        empty = [p for p in parts if (path / p).is_dir() and p not in ("tokenizer", "scheduler")
                 and not any((path / p).glob("*.safetensors")) and not any((path / p).glob("*.bin"))]
        partial = [str(f.relative_to(path)) for f in path.rglob("*.incomplete")][:5]
        index = json.loads((path / "model_index.json").read_text())
        cls = index.get("_class_name")
        if missing or empty or partial:
            what = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                          f"no weights in {', '.join(empty)}" if empty else "",
                                          f"unfinished downloads {partial}" if partial else "") if x)
            checks.append(Check("model", PROBLEM, f"{path}: {family.label} ({cls}) folder is incomplete: {what}",
                                f"re-download {family.hf_id} into it (huggingface-cli download {family.hf_id} "
                                f"--local-dir {path})"))
        else:
            sizes = model_sizes(model)
            checks.append(Check("model", OK, f"{path}: {family.label} ({cls}), weights {sizes.to_dict()['dit_gib']} "
                                f"GiB DiT, {sizes.text_encoder_gib:.1f} GiB text encoder"))
        return checks
    if role == CLIENT_ONLY:
        return [Check("model", OK, f"{family.hf_id}: the GPU machine's server downloads it; this client-only box "
                      "never does, so its disk space is not checked")]
    cache = hf_cache_dir(config)
    repo_dir = cache / ("models--" + family.hf_id.replace("/", "--"))
    snapshots = list((repo_dir / "snapshots").glob("*")) if repo_dir.is_dir() else []
    sizes = model_sizes(model)
    need_gb = (sum(sizes.dit_params) + sizes.text_encoder_params) * 2 / 1e9 + sizes.vae_params * 4 / 1e9 \
        + sizes.audio_encoder_params * sizes.audio_encoder_bytes / 1e9
    if snapshots:
        checks.append(Check("model", OK, f"{family.hf_id} is in the HF cache ({repo_dir})"))
    else:
        checks.append(Check("model", OK, f"{family.hf_id} is not downloaded yet: the first launch downloads "
                            f"at least {need_gb:.0f} GB into {cache}"))
    probe = cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free_gb = shutil.disk_usage(probe).free / 1e9
    except OSError as exc:
        checks.append(Check("disk", UNCHECKED, f"cannot read free space of {probe}: {exc}"))
        return checks
    if snapshots:
        checks.append(Check("disk", OK, f"{free_gb:.0f} GB free at {probe}; the model is already downloaded"))
    elif free_gb < need_gb * 1.1:
        checks.append(Check("disk", PROBLEM, f"{free_gb:.0f} GB free at {probe}, the download needs at least "
                            f"{need_gb:.0f} GB", "free disk space, or point HF_HOME / HF_HUB_CACHE (local config "
                            "extra_env) at a bigger disk, or download to a folder and use it as the model"))
    else:
        checks.append(Check("disk", OK, f"{free_gb:.0f} GB free at {probe} (download needs at least {need_gb:.0f} GB)"))
    return checks


# What vLLM-Omni 0.30 reads from Wan2.2 S2V's original layout (pipeline_wan2_2_s2v.py:632-688).
_S2V_FILES = ("config.json", "Wan2.1_VAE.pth", "models_t5_umt5-xxl-enc-bf16.pth", "google/umt5-xxl",
              "wav2vec2-large-xlsr-53-english")


def _check_s2v_folder(path: Path, family: WanFamily) -> Check:
    missing = [f for f in _S2V_FILES if not (path / f).exists()]
    if not any(path.glob("diffusion_pytorch_model*.safetensors")):
        missing.insert(1, "diffusion_pytorch_model-*.safetensors")
    partial = [str(f.relative_to(path)) for f in path.rglob("*.incomplete")][:5]
    if missing or partial:
        what = "; ".join(x for x in (f"missing {', '.join(missing)}" if missing else "",
                                      f"unfinished downloads {partial}" if partial else "") if x)
        return Check("model", PROBLEM, f"{path}: {family.label} (original layout) folder is incomplete: {what}",
                     f"re-download {family.hf_id} into it (huggingface-cli download {family.hf_id} --local-dir {path})")
    sizes = model_sizes(str(path))
    return Check("model", OK, f"{path}: {family.label} (original layout), weights {sizes.to_dict()['dit_gib']} GiB "
                 f"DiT, {sizes.text_encoder_gib:.1f} GiB text encoder, {sizes.audio_encoder_gib:.1f} GiB audio encoder")


def _check_port(host: str, port: Optional[int]) -> Check:
    if port is None:
        try:
            with socket.socket() as s:
                s.bind((host, 0))
                got = s.getsockname()[1]
            return Check("port", OK, f"no fixed port: a free one is picked per launch on {host} (e.g. {got})")
        except OSError as exc:
            return Check("port", PROBLEM, f"cannot bind any port on {host}: {exc}",
                         "set the host in the local config to an address of this machine (127.0.0.1)")
    try:
        with socket.socket() as s:
            s.bind((host, port))
        return Check("port", OK, f"{host}:{port} is free")
    except OSError as exc:
        return Check("port", PROBLEM, f"{host}:{port} is taken ({exc.strerror or exc})",
                     "stop what listens there (a server from an earlier ComfyUI run?) or leave the port empty "
                     "to pick a free one")


def _offload_ram_gib(family: WanFamily) -> float:
    """Host RAM CPU offload pins for `family`: its DiT experts and the text encoder, in bf16."""
    return family.dit_params_b * family.experts * 2 * 1e9 / GIB + 10.6


def _check_host_ram(family: Optional[WanFamily], role: str) -> Check:
    """Host RAM against what offload of the checked model pins (without a model: of the smallest,
    TI2V-5B, with A14B's need named), so the warning is about the model in question; on a
    client-only box no server runs, so nothing is pinned here."""
    try:
        import psutil
    except ImportError:
        return Check("host_ram", UNCHECKED, "psutil is not installed, so host RAM was not checked",
                     "pip install psutil")
    vm = psutil.virtual_memory()
    total, avail = vm.total / GIB, vm.available / GIB
    summary = f"{total:.1f} GiB total, {avail:.1f} GiB available"
    if role == CLIENT_ONLY:
        return Check("host_ram", OK, summary + "; offload needs host RAM only where the server runs")
    checked = family or min(FAMILIES.values(), key=_offload_ram_gib)
    need = _offload_ram_gib(checked)
    if avail >= need + 4:
        if family is None and avail < _offload_ram_gib(FAMILIES["t2v_a14b"]) + 4:
            summary += (f"; enough for CPU offload of {checked.label} (about {need:.0f} GiB), not of an A14B model "
                        f"(about {_offload_ram_gib(FAMILIES['t2v_a14b']):.0f} GiB)")
        return Check("host_ram", OK, summary)
    return Check("host_ram", WARNING, summary, f"CPU offload of {checked.label} pins about {need:.0f} GiB of host "
                 "RAM: close other programs, or use GPUs that hold the model without offload")


def _check_local_models(roots: Sequence[Path]) -> Check:
    """The Diffusers folders under `roots` that Load Model lists, and those it leaves out, with why."""
    skipped: dict[str, str] = {}
    found = find_local_models(roots, skipped)
    listing = "".join(f"\n  {label}: {m.family.label}" for label, m in sorted(found.items()))
    listing += "".join(f"\n  {folder}: not listed, {why}" for folder, why in sorted(skipped.items()))
    where = ", ".join(str(r) for r in roots)
    if not found and not skipped:
        return Check("local_models", OK, f"no Diffusers folders under {where}")
    return Check("local_models", WARNING if skipped else OK,
                 f"{len(found)} Wan2.2 folder(s) in Load Model, {len(skipped)} left out, under {where}:{listing}",
                 "fix or remove the folders left out (each says why); Load Model lists only Wan2.2 Diffusers folders"
                 if skipped else "", {"listed": sorted(found), "left_out": skipped})


def _server_env_for_role(checks: list[Check], role: str) -> list[Check]:
    """A missing server environment is a problem on a GPU box, expected on a client-only one."""
    out = []
    for c in checks:
        if c.name == "server_env" and c.status == UNCHECKED:
            if role == GPU_BOX:
                c = Check(c.name, PROBLEM, c.summary.replace("server environment not checked: ", "no server "
                          "environment: ", 1) + "; this GPU box needs one to run a local server", c.fix, c.details)
            elif role == CLIENT_ONLY:
                c = Check(c.name, OK, "no server environment, and none is needed: this client-only box uses a "
                          "server on a GPU machine", "", c.details)
        out.append(c)
    return out


def run_doctor(model: Optional[str] = None, *, config: Optional[LocalConfig] = None, host: Optional[str] = None,
               port: Optional[int] = None, nvml: Any = None, runner: Callable[..., Any] = subprocess.run,
               timeout_s: float = 90.0, lora_roots: Sequence[Path] = (),
               model_roots: Sequence[Path] = ()) -> DoctorReport:
    """Run every check. `nvml` may be a stand-in module (tests); `runner` replaces subprocess.run.
    `lora_roots`: the folders to list LoRAs from (ComfyUI's models/loras); `model_roots`: the
    Diffusers folders Load Model lists from (ComfyUI's models/diffusers)."""
    config = config or load_local_config()
    checks: list[Check] = []
    mod, reason, absent = open_nvml(nvml)
    if mod is None:
        gpu_checks = unlisted(reason)
        gpus: list[GpuInfo] = []
        peers: list[dict[str, Any]] = []
    else:
        try:
            gpu_checks, gpus, peers = check_gpus(mod)
        finally:
            try:
                mod.nvmlShutdown()
            except Exception:
                pass
    checks += gpu_checks
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        checks.append(Check("cuda_visible_devices", WARNING if visible.strip() == "" else OK,
                            f"this process has CUDA_VISIBLE_DEVICES={visible!r}",
                            "the launcher sets CUDA_VISIBLE_DEVICES for the server itself from the GPU setting"
                            if visible.strip() == "" else ""))
    if mod is not None and not gpus:
        absent = gpu_checks[0].summary.endswith(NONE_FOUND)        # NVML runs and lists none
    from_env, env_check = env_gpus(gpus)
    checks += [env_check] if env_check is not None else []
    role = box_role(gpus or from_env, absent)
    env_checks, env = check_server_env(config, runner, timeout_s, machine_has_gpus=bool(gpus or from_env))
    checks += _server_env_for_role(env_checks, role)
    checks.append(_check_host_ram(_family_or_none(model), role))
    checks += _check_model(model, config, role)
    checks += _check_wan_vae_config(model, config)
    if model_roots:
        checks.append(_check_local_models(model_roots))
    if lora_roots:
        checks.append(_check_loras(lora_roots, major_minor(env.get("vllm-omni")) if env else None))
    checks.append(_check_port(host or config.host, port if port is not None else config.port))
    checks.append(Check("launcher", OK, f"python {platform.python_version()} at {sys.executable}"))
    return DoctorReport(checks=checks, gpus=gpus or from_env, peers=peers, server_env=env, role=role,
                        gpu_source="" if gpus or not from_env else f"sizes from {GPU_MEMORY_ENV}")


def _family_or_none(model: Optional[str]) -> Optional[WanFamily]:
    try:
        return family_for(model) if model else None
    except LauncherError:
        return None          # the model check says why
