"""The strings by which vLLM-Omni's output reveals a failure, written down once.

The log watcher (is this line an out-of-memory error during a job?), the failure
classifier (why did the server exit?) and the HTTP client (why did this job fail?) all
recognise the same upstream texts; they import them from here so a new torch or vLLM
wording is taught in one place.
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
