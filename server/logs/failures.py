"""Why a server failed, from its exit code and log tail, and what the user can change.

vLLM-Omni dies with a Python traceback deep in engine code; the sentence that matters is
somewhere in the last lines. Each rule below recognises one known failure (the messages
vLLM-Omni 0.26/0.30, torch, Hugging Face and the real argument parser print; the shared
patterns are in failure_patterns.py) and turns it into a LauncherError that names the
setting to change. The raw tail always travels along in `raw`, so an
unknown failure, or a wrong guess, still shows the server's own words.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ...client.http_errors import OOM_FIX
from ...errors import LauncherError
from ...errors import failure_patterns as patterns
from ...errors.config_names import env_var
from ..config.server_env import SETUP_COMMAND

# Failure kinds (stable strings: the OOM fallback hook and the tests use them).
OOM_LOAD, OOM_JOB = "oom_load", "oom_job"
DEVICES, GATED, MODEL_NOT_FOUND, PORT_IN_USE = "devices", "gated", "model_not_found", "port_in_use"
OMNI_MISSING, VERSION_MISMATCH, NCCL, IMPORT_ERROR = "omni_missing", "version_mismatch", "nccl", "import_error"
BAD_ARGS, CONFIG, KILLED, TIMEOUT, HUNG, CRASH = "bad_args", "config", "killed", "timeout", "hung", "crash"
EXECUTABLE, GPU_BUSY, CANCELLED = "executable", "gpu_busy", "cancelled"
HF_UNREACHABLE, HF_CONFIG_MISSING = "hf_unreachable", "hf_config_missing"

# Failures that a restart of the same command would only repeat (never loop on these).
PERMANENT = frozenset({DEVICES, GATED, MODEL_NOT_FOUND, OMNI_MISSING, IMPORT_ERROR, BAD_ARGS, CONFIG,
                       EXECUTABLE, OOM_LOAD, HF_UNREACHABLE, HF_CONFIG_MISSING})


class ServerFailure(LauncherError):
    """A LauncherError that also says which kind of failure it was."""

    def __init__(self, kind: str, what: str, why: str = "", fix: str = "", *, setting: str = "",
                 raw: str = "", exit_code: Optional[int] = None) -> None:
        self.exit_code = exit_code
        super().__init__(what, why, fix, setting=setting, raw=raw, kind=kind)


class LaunchCancelled(ServerFailure):
    """A start given up on request (ComfyUI's Cancel, Ctrl-C, a stop); its processes are gone."""

    def __init__(self, phase_text: str) -> None:
        super().__init__(CANCELLED, "The server start was cancelled",
                         f"a cancel or stop was requested while it was at: {phase_text}",
                         "queue the prompt (or run the command) again to start it")


@dataclass(frozen=True)
class Context:
    """What the classifier may mention: where it happened and what was launched."""

    model: str = ""
    gpus: str = "all visible"
    world_size: int = 1
    port: Optional[int] = None
    port_configured: bool = False
    ever_ready: bool = False          # the server answered /health during this launch
    exit_code: Optional[int] = None
    log_path: str = ""                # the server's log file, which every start failure names


def _with_log(fix: str, log_path: str) -> str:
    """`fix` followed by where the whole server log is (the raw tail below is only its end)."""
    return f"{fix.rstrip('.')}; the whole server log is {log_path}" if log_path else fix


_Rule = Callable[[re.Match[str], Context], tuple[str, str, str, str, str]]   # kind, what, why, fix, setting


def _omni_missing(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    return (OMNI_MISSING, "vLLM-Omni is not installed in the server environment",
            "`vllm serve --omni` found vLLM but not the vllm_omni package, so it exits at once",
            f"install the pinned pair (vllm and vllm-omni of the same major.minor): run `{SETUP_COMMAND}` "
            "(it repairs the default server environment, or the one server_env names with --path)", "server_env")


def _devices(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    need, have = m.group(1), m.group(2)
    return (DEVICES, f"The server needs {need} GPU(s) but only {have} are visible to it",
            f"the parallel configuration's world size is {need}; the server sees GPUs {c.gpus}",
            f"select {need} GPUs, or lower the parallel degree to {have} (or set parallel mode to 'none')",
            "parallel_degree")


def _gated(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    return (GATED, f"Hugging Face refused to download {c.model or 'the model'}",
            "the repository is gated or private and the server has no token that may read it",
            "accept the model's license on huggingface.co, then put HF_TOKEN in the launcher config's extra_env "
            "(or download the model yourself and select the local folder)", "model")


def _hf_unreachable(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    host = m.group("host") or m.group("host2") or "the Hugging Face Hub"
    model = c.model or "the model"
    text = m.string
    end = text.find("\n", m.end())
    said = patterns.strip_pid_prefix(text[text.rfind("\n", 0, m.start()) + 1:end if end >= 0 else None]).strip()
    said = said if len(said) <= 200 else said[:199] + "…"      # upstream's line, as it said it
    why = (f"the server must download {model} (it is not complete in this machine's Hugging Face cache), and "
           + (f"Hugging Face's offline mode is on ({said})" if m.group("offline") else
              f"its requests to {host} failed ({said}): the machine is offline, behind a proxy, or its DNS does "
              f"not resolve {host}"))
    return (HF_UNREACHABLE, f"The server could not reach Hugging Face to download {model}", why,
            f"download {model} where Hugging Face is reachable (huggingface-cli download {model}) and select the "
            "local folder as the model, or copy it into this machine's Hugging Face cache and set HF_HUB_OFFLINE=1 "
            "in the launcher config's extra_env; behind a mirror or a proxy, set HF_ENDPOINT (or HTTPS_PROXY) "
            "there", "model")


def vae_config_text(hub: Optional[str], cause: str) -> tuple[str, str, str, str, str]:
    """Why an S2V server cannot load its VAE config, and how to give it one: said the same before a
    launch (server/launch/hf_cache.py refuses it), by the doctor, and from a server log (the rule below)."""
    repo, file = patterns.WAN_VAE_CONFIG_REPO, patterns.WAN_VAE_CONFIG_FILE
    where = f"the Hugging Face cache at {hub}" if hub else \
        "the server's Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)"
    into = f" --cache-dir {shlex.quote(hub)}" if hub else ""
    return (HF_CONFIG_MISSING, f"Wan2.2 S2V-14B cannot load its VAE: {repo} {file} is not in the Hugging Face cache",
            f"vLLM-Omni loads S2V's Wan2.1_VAE.pth with diffusers' from_single_file, which reads the VAE's config "
            f"from the Hub repo {repo} ({file}) through {where}; {cause}, so upstream stops with: "
            f"{patterns.WAN_VAE_CONFIG_LINE}",
            f"download just that file into that cache where huggingface.co is reachable: `hf download {repo} {file}"
            f"{into}` (huggingface_hub before 1.0: `huggingface-cli download {repo} {file}{into}`), or copy its "
            f"models--{repo.replace('/', '--')} folder there; or let the server ask the Hub: remove HF_HUB_OFFLINE "
            "and TRANSFORMERS_OFFLINE from the launcher config's extra_env and from the environment ComfyUI starts in",
            "extra_env")


def _vae_config(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    return vae_config_text(None, "offline mode is on or the Hub could not be reached, and the cache does not hold it")


def _not_found(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    return (MODEL_NOT_FOUND, f"The server could not find the model {c.model or ''}".rstrip(),
            "the Hugging Face id does not exist, the local folder is missing files, it is not a Wan2.2 "
            "Diffusers repo, or the machine is offline (HF_HUB_OFFLINE) and the model is not in the cache",
            "check the model id or folder (it needs model_index.json); to download, make sure the server "
            "environment can reach huggingface.co", "model")


def _port(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    port = f"Port {c.port}" if c.port else "The port"
    fix = ("choose another port in the launcher config, or leave it empty to pick a free one"
           if c.port_configured else "start again (a free port is picked each time)")
    return (PORT_IN_USE, f"{port} is already in use", "another program (or an earlier server) is listening on it",
            fix, "port")


def _nccl(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    return (NCCL, "The GPUs could not talk to each other (NCCL error)",
            f"multi-GPU communication failed while using {c.world_size} GPU(s): a driver/topology problem, "
            "a GPU in use by another job, or NVLink multicast on a machine that does not allow it",
            "try parallel mode 'none' on one GPU to confirm; set NCCL_NVLS_ENABLE=0 and "
            "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 in the launcher config's extra_env; check `nvidia-smi topo -m`",
            "parallel_mode")


def _import(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    detail = patterns.strip_pid_prefix(m.group(0).strip())
    return (IMPORT_ERROR, "The server environment is missing a Python package or has a broken one",
            f"{detail}; the server runs in its own environment, separate from ComfyUI's",
            f"repair the server environment with `{SETUP_COMMAND}` (it pins vllm, vllm-omni, "
            "torch and diffusers together)", "server_env")


def _bad_args(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    detail = m.group(0).strip()
    return (BAD_ARGS, "The installed vLLM-Omni rejected a command-line flag",
            f"its argument parser said: {detail}. The flag may not exist in this version",
            "remove the flag from extra flags, or upgrade the server environment to the pinned vLLM-Omni version",
            "extra_flags")


def _config(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    return (CONFIG, "vLLM-Omni refused the configuration",
            f"it said: {m.group(0).strip()}", "change the setting it names (see the server's message below)",
            "parallel_mode")


def _oom(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    detail = _oom_detail(m.string)
    if c.ever_ready:
        return (OOM_JOB, "The GPU ran out of memory during a job",
                f"the model fits, but this request's activations did not{detail}", OOM_FIX, "vae_tiling")
    return (OOM_LOAD, "The GPU ran out of memory while loading the model",
            f"the weights of {c.model or 'the model'} do not fit on GPUs {c.gpus}{detail}",
            "set offload to 'module' (text encoder and DiT take turns on the GPU), or quantization to fp8, "
            "or use 2 GPUs with tensor/hsdp parallel; close other programs using the GPU", "offload")


def _oom_detail(text: str) -> str:
    m = patterns.OOM_DETAIL.search(text)
    if m:
        return f" (tried to allocate {m.group(1)} on GPU {m.group(2)}: {m.group(4)} free of {m.group(3)})"
    return ""


def _head_gone(m: re.Match[str], c: Context) -> tuple[str, str, str, str, str]:
    where = m.group(1) or m.group(2)
    return (CRASH, f"The replica could not register with the head at {where}",
            "the head's registration port refused connections after it had answered (the head exited or is "
            "restarting), or the head did not answer the registration within upstream's 300 s",
            "nothing while the head restarts: the launcher starts this replica again; otherwise start the head "
            "(serve --accept-replicas PORT) or fix --join", "--join")


_RULES: tuple[tuple[re.Pattern[str], _Rule], ...] = (
    (patterns.HEAD_GONE, _head_gone),
    (patterns.OMNI_MISSING, _omni_missing),
    (patterns.DEVICES_SHORT, _devices),
    (patterns.GATED_REPO, _gated),
    # before the not-found rule: the same traceback also names LocalEntryNotFoundError
    (patterns.WAN_VAE_CONFIG_MISSING, _vae_config),
    (patterns.MODEL_NOT_FOUND, _not_found),
    (patterns.OOM, _oom),
    # after OOM: a server that fell back to its cache after failed Hub requests can still run out of memory
    (patterns.HF_UNREACHABLE, _hf_unreachable),
    (patterns.PORT_IN_USE, _port),
    (patterns.NCCL_ERROR, _nccl),
    (patterns.BAD_ARGS, _bad_args),
    (patterns.IMPORT_ERROR, _import),
    (patterns.CONFIG_REFUSED, _config),
)


def _mismatch_note(text: str) -> str:
    if patterns.VERSION_MISMATCH.search(text):
        return (" (also: vLLM and vLLM-Omni have different major/minor versions in the server environment, "
                f"which upstream only warns about; repair it with `{SETUP_COMMAND}`)")
    return ""


def classify(tail: Sequence[str], ctx: Context) -> ServerFailure:
    """Explain a server that exited (or failed to start) from its last log lines."""
    text = "\n".join(tail)
    raw = "\n".join(tail[-40:])
    note = _mismatch_note(text)
    for pattern, rule in _RULES:
        m = pattern.search(text)
        if m:
            kind, what, why, fix, setting = rule(m, ctx)
            return ServerFailure(kind, what, why + note, _with_log(fix, ctx.log_path), setting=setting, raw=raw,
                                 exit_code=ctx.exit_code)
    code = ctx.exit_code
    if note:
        return ServerFailure(VERSION_MISMATCH, f"The vLLM-Omni server exited (code {code})",
                             "vLLM and vLLM-Omni in the server environment have different major/minor versions, "
                             "and upstream only warns about it before failing later",
                             _with_log(f"repair the server environment with `{SETUP_COMMAND}` (it pins the pair)",
                                       ctx.log_path), setting="server_env", raw=raw, exit_code=code)
    if code in (137, -9) or (text.rstrip().endswith("Killed")):
        return ServerFailure(KILLED, "The server was killed (SIGKILL)",
                             "the operating system's out-of-memory killer or another program ended it; "
                             "loading a model needs host RAM roughly the size of its weights",
                             _with_log("free host memory (close other programs) or avoid CPU offload, which keeps "
                                       "weights in host RAM", ctx.log_path), setting="offload", raw=raw,
                             exit_code=code)
    stage = "after it was ready" if ctx.ever_ready else "while starting"
    return ServerFailure(CRASH, f"The vLLM-Omni server exited {stage} (exit code {code})",
                         "its log does not match a known failure",
                         _with_log("read the server's last lines below; if they name a setting, change it, else "
                                   "report them", ctx.log_path), raw=raw, exit_code=code)


def oom_job_error(tail: Sequence[str], ctx: Context) -> ServerFailure:
    """A job hit CUDA OOM but the server lives on (the job fails, the next may work)."""
    text = "\n".join(tail)
    match = patterns.OOM.search(text) or re.search(r"$", text)
    job_ctx = Context(model=ctx.model, gpus=ctx.gpus, world_size=ctx.world_size, port=ctx.port, ever_ready=True)
    kind, what, why, fix, setting = _oom(match, job_ctx)
    return ServerFailure(kind, what, why, fix, setting=setting, raw="\n".join(tail[-40:]))


def startup_timeout(timeout_s: float, phase_text: str, tail: Sequence[str], setting_hint: str,
                    log_path: str = "") -> ServerFailure:
    minutes = timeout_s / 60
    return ServerFailure(TIMEOUT, f"The server did not become ready within {minutes:.0f} minutes",
                         f"it was still at: {phase_text}",
                         _with_log(f"if it is making progress (e.g. a large download), raise the startup timeout "
                                   f"({setting_hint}); otherwise read the last lines below", log_path),
                         setting="startup_timeout_s", raw="\n".join(tail[-40:]))


def hung(seconds: float, tail: Sequence[str]) -> ServerFailure:
    return ServerFailure(HUNG, f"The server stopped answering /health for {seconds:.0f} s while its process "
                         "was still running", "the engine is stuck (a hung GPU kernel, NCCL wait or deadlock)",
                         "it is being restarted; if this repeats, try fewer GPUs or update the driver",
                         raw="\n".join(tail[-40:]))


def port_taken(port: int) -> ServerFailure:
    return ServerFailure(PORT_IN_USE, f"Port {port} is already in use",
                         "another program (or a server started outside this ComfyUI) is listening on it",
                         f"change 'port' in the launcher config ({env_var('port')}), or remove it so a "
                         "free port is chosen", setting="port")


def executable_missing(argv0: str, detail: str) -> ServerFailure:
    return ServerFailure(EXECUTABLE, f"Cannot run the server program {argv0!r}", detail,
                         f"run `{SETUP_COMMAND}` (the launcher then finds the default server environment), or set "
                         "server_env (or server_command) in the launcher config to an environment it made", setting="server_env")
