"""The strings by which vLLM-Omni's output reveals a failure, written down once.

The log watcher (is this line an out-of-memory error during a job?), the failure
classifier (why did the server exit?) and the HTTP client (why did this job fail?) all
recognise the same upstream texts; they import them from here so a new torch or vLLM
wording is taught in one place. Each layer decides what a match means to its user; only the
wording lives here.
"""
from __future__ import annotations

import re

# torch: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ..." (older torch:
# torch.cuda.OutOfMemoryError); the job error body repeats the message, sometimes lowercased or
# shortened ("out of memory", "CUDA OOM"); the CUDA runtime's own name is cudaErrorMemoryAllocation.
OOM = re.compile(r"out of memory|OutOfMemoryError|cuda oom|cudaErrorMemoryAllocation", re.IGNORECASE)
# "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.50 GiB is free"
OOM_DETAIL = re.compile(r"Tried to allocate ([\d.]+ [GM]iB)\.? GPU (\d+) has a total capacity of ([\d.]+ [GM]iB) "
                        r"of which ([\d.]+ [GM]iB) is free")
# vLLM tags each line with the process that printed it: "(APIServer pid=914) ", "(Worker pid=12) ".
PID_PREFIX = r"\([A-Za-z_]+ pid=\d+\)\s*"
PID_PREFIX_RE = re.compile(r"^\s*(?:" + PID_PREFIX + r")?")
# The Hugging Face Hub cannot be reached (no network, DNS, a proxy, offline mode). huggingface_hub
# logs each try of a download as "'[Errno -2] Name or service not known' thrown while requesting HEAD
# https://huggingface.co/Wan-AI/Wan2.2-TI2V-5B-Diffusers/resolve/main/model_index.json" (then "Retrying
# in 1s [Retry 1/5]."); httpx / requests name the failure "Temporary failure in name resolution",
# "Failed to resolve", "Network is unreachable", "Connection refused" or a proxy/timeout error;
# transformers and diffusers add "We couldn't connect to 'https://huggingface.co'"; vLLM's repo_utils
# "Error retrieving file list: [Errno -2] Name or service not known". The host is the group `host`
# or `host2` (HF_ENDPOINT may point at a mirror), matched only on a Hub URL (/resolve/, /api/);
# `offline`: HF_HUB_OFFLINE is on and the files are not in the cache.
_NET_FAILURE = (r"Name or service not known|Temporary failure in name resolution|Failed to resolve|"
                r"nodename nor servname provided|Network is unreachable|No route to host|Connection refused|"
                r"ProxyError|Tunnel connection failed|ConnectTimeout|Connection timed out|Max retries exceeded")
HF_UNREACHABLE = re.compile(
    r"(?:" + _NET_FAILURE + r")[^\n]*?https?://(?P<host>[^/\s'\"]+)/(?:[^\s'\"]*/resolve/|api/)|"
    r"We couldn't connect to '?https?://(?P<host2>[^/\s'\"]+)|"
    r"Error retrieving file list: [^\n]*?(?:" + _NET_FAILURE + r")|"
    r"(?P<offline>OfflineModeIsEnabled[^\n]*|offline mode is enabled[^\n]*)")
# Wan2.2 S2V's original layout holds its VAE as `Wan2.1_VAE.pth`, which vLLM-Omni 0.30 loads with diffusers'
# `from_single_file` (pipeline_wan2_2_s2v.py:667-669). diffusers takes a Wan VAE's config from the Hub repo below
# (single_file_utils.py: every Wan VAE maps to "wan-t2v-14B", single_file_model.py: subfolder "vae"), through the
# HF cache; when the cache lacks it and the Hub cannot be asked (HF_HUB_OFFLINE, no network),
# configuration_utils.load_config ends the server with this line.
WAN_VAE_CONFIG_REPO = "Wan-AI/Wan2.1-T2V-14B-Diffusers"
WAN_VAE_CONFIG_FILE = "vae/config.json"
WAN_VAE_CONFIG_LINE = f"OSError: {WAN_VAE_CONFIG_REPO} does not appear to have a file named config.json."
WAN_VAE_CONFIG_MISSING = re.compile(re.escape(WAN_VAE_CONFIG_REPO) + r" does not appear to have a file named "
                                    r"config\.json")
# upstream only warns when vllm and vllm-omni of different major.minor are installed together
VERSION_MISMATCH = re.compile(r"mismatched major/minor versions")

# ---- why a server exited (server/logs/failures.py's rules, in the order it tries them) ----------------------
# vllm's `serve --omni` without the vllm_omni package
OMNI_MISSING = re.compile(r"--omni flag requires a valid instance of vllm-omni")
# vLLM-Omni's stage check: group 1 the GPUs the parallel world needs, group 2 those visible
DEVICES_SHORT = re.compile(r"Stage \d+ requires (\d+) device\(s\)[^\n]*?but (\d+) device\(s\) are available")
# huggingface_hub on a gated or private repo without a token that may read it
GATED_REPO = re.compile(r"Access to model .* is restricted|GatedRepoError|Cannot access gated repo")
# no such repo, an incomplete folder, or a repo that is not a Diffusers pipeline vLLM-Omni knows
MODEL_NOT_FOUND = re.compile(
    r"RepositoryNotFoundError|Repository Not Found|is not a local folder and is not a valid model identifier|"
    r"did not resolve to a registered Omni pipeline|LocalEntryNotFoundError|"
    r"model_index\.json[^\n]*(?:not found|No such file)|No such file or directory[^\n]*model_index\.json|"
    r"requires an explicit model")
# uvicorn's bind of a taken port (EADDRINUSE is errno 98 on Linux)
PORT_IN_USE = re.compile(r"Address already in use|\[Errno 98\]")
NCCL_ERROR = re.compile(r"NCCL error|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|ncclInvalidUsage|"
                        r"ProcessGroupNCCL[^\n]*(?:[Tt]imeout|[Ee]rror)|NCCL WARN[^\n]*(?:failed|error)")
# argparse's refusals of a flag or value (the whole line, which names it)
BAD_ARGS = re.compile(r"error: unrecognized arguments: [^\n]*|error: argument [^\n]*invalid choice[^\n]*|"
                      r"error: argument [^\n]*expected [^\n]*")
# only as a traceback's last line: servers log benign "No module named 'flashinfer'" warnings
IMPORT_ERROR = re.compile(r"^(?:" + PID_PREFIX + r")?(?:ModuleNotFoundError|ImportError): [^\n]*", re.M)
# vLLM-Omni's own refusals of a parallel / compile / runtime combination (the whole line)
CONFIG_REFUSED = re.compile(r"HSDP \(FSDP2\) is not compatible with TP[^\n]*|diffusion_compile_granularity='full' "
                            r"is incompatible[^\n]*|step_execution=True requires a pipeline[^\n]*|"
                            r"Unknown diffusion config field[^\n]*")

# ---- why a job failed (a failed job's error message; client/http_errors.py) -----------------------------------
# pipeline_wan2_2_i2v.py: "No image is provided. This model requires an image to run."
NO_IMAGE = re.compile(r"no image is provided", re.IGNORECASE)
# I2V's "`height` and `width` have to be divisible by 16 but are ..." and S2V's "... must be divisible by N,
# got ..." (not the transformer's "dim (...) must be divisible by num_heads", which names neither)
SIZE_NOT_DIVISIBLE = re.compile(r"(?:height|width)[^\n]*divisible by|divisible by[^\n]*(?:height|width)",
                                re.IGNORECASE)
# vllm's EngineDeadError ("EngineCore encountered an issue. See stack trace (above) ..."): the worker died
ENGINE_DEAD = re.compile(r"engine\s*dead|engine\s*core", re.IGNORECASE)

# ---- why the server refused a call (an HTTP error answer's message; client/http_errors.py) ---------------------
# GET /v1/videos/{id}/content of a failed job, HTTP 422: "Video generation failed. Check job status for error details."
CONTENT_OF_FAILED_JOB = re.compile(r"generation failed", re.IGNORECASE)
# "Model mismatch: request specifies 'X' but server is running 'Y'." (400)
MODEL_MISMATCH = re.compile(r"model mismatch", re.IGNORECASE)
# a 404 about the model rather than the route (vLLM: "The model `X` does not exist.")
MODEL_UNKNOWN = re.compile(r"model", re.IGNORECASE)
# 409: "... is not supported with --api-server-count > 1 because the operation uses process-local frontend
# state", or "... require a single API worker ..."
API_SERVER_COUNT = re.compile(r"api-server-count|single api|api server", re.IGNORECASE)


def is_oom(text: str) -> bool:
    """Whether `text` (a log line or an error body) reports a CUDA out-of-memory error."""
    return bool(OOM.search(text))


def strip_pid_prefix(line: str) -> str:
    """`line` without leading blanks and vLLM's "(APIServer pid=N) " tag."""
    return PID_PREFIX_RE.sub("", line, count=1)

# A replica of a head + headless deployment (vLLM-Omni 0.30, stage_diffusion_proc.py) prints this once its
# engine is loaded and the head has its READY handshake: "StageDiffusionProc registered with OmniCoordinator
# (stage_id=0 replica_id=1 coord=tcp://...)". One line per replica; a headless runtime has no HTTP port, so
# these lines are its readiness.
REPLICA_REGISTERED = re.compile(r"StageDiffusionProc registered with OmniCoordinator \(stage_id=\d+ replica_id=(\d+)")
# A headless runtime without its head: upstream's "Timed out waiting for registration response from
# OmniMasterServer (ADDR:PORT) for stage 0." (it waits 300 s), or the line the launcher writes into the log
# when the head's port refuses while the runtime starts (server/supervision/multi_host.py, HeadlessRun).
HEAD_GONE = re.compile(r"the head's registration port (\S+) refuses connections|"
                       r"Timed out waiting for registration response from OmniMasterServer \((\S+)\)")
