"""The doctor's GPU checks: what NVML lists (memory, driver, compute capability, peer-to-peer,
this process's own GPU memory), the sizes VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB gives instead, and
what the box is for (a GPU box, client-only, or unknown). planner/doctor.py runs them.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ..errors import LauncherError
from .doctor_report import CLIENT_ONLY, GPU_BOX, GPUS_UNKNOWN, OK, PROBLEM, UNCHECKED, WARNING, Check
from .gpus import GpuInfo, hypothetical_gpus, peer_status, processes_on_gpus, query_gpus
from .gpu_memory_env import GPU_MEMORY_ENV, env_gpu_memory, sizes_source


def unlisted(reason: Optional[str]) -> list[Check]:
    """The GPU checks where NVML could not list GPUs (or could not start), saying why."""
    return [Check("gpus", UNCHECKED, f"could not list GPUs: {reason}",
                  "run the doctor on the machine with the NVIDIA GPUs (with nvidia-ml-py installed), or set "
                  f"{GPU_MEMORY_ENV} to their sizes where NVML cannot see them; planning still works with "
                  "--gpu-memory"),
            Check("peer_to_peer", UNCHECKED, "no GPU information, so peer-to-peer access was not checked"),
            Check("own_gpu_memory", UNCHECKED, "no GPU information, so this process's GPU memory was not checked")]


def check_gpus(nvml: Any) -> tuple[list[Check], list[GpuInfo], list[dict[str, Any]]]:
    """The GPU checks from an initialised NVML, the GPUs it lists and their peer-to-peer status."""
    gpus, reason = query_gpus(nvml, shutdown=False)
    if not gpus:
        return unlisted(reason), [], []
    checks: list[Check] = []
    desc = "; ".join(f"GPU {g.index} {g.name}, {g.total_gib:.1f} GiB total, {g.free_gib:.1f} free"
                     + (f", CC {g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "")
                     for g in gpus)
    status, fix = OK, ""
    busy = [g for g in gpus if g.free_gib is not None and g.free_gib < 0.9 * g.total_gib - 1.0]
    if busy:
        status = WARNING
        fix = ("other processes hold memory on " + ", ".join(f"GPU {g.index} ({g.total_gib - g.free_gib:.1f} GiB)"
                                                             for g in busy) +
               ": stop them, or plan with the free memory (the planner uses it)")
    old = [g for g in gpus if g.compute_capability and g.compute_capability < (8, 0)]
    if old:
        status = PROBLEM
        fix = (fix + "; " if fix else "") + ("GPUs below compute capability 8.0 (" +
                                             ", ".join(f"GPU {g.index}" for g in old) +
                                             ") have no bf16/FlashAttention: use Ampere or newer")
    driver = gpus[0].driver or "unknown"
    checks.append(Check("gpus", status, f"{len(gpus)} GPU(s), driver {driver}: {desc}", fix,
                        {"count": len(gpus)}))
    peers: list[dict[str, Any]] = []
    if len(gpus) < 2:
        checks.append(Check("peer_to_peer", OK, "one GPU: no peer-to-peer traffic needed"))
    else:
        try:
            peers = peer_status(nvml, gpus)
            bad = [p for p in peers if p["p2p_read"] != "ok"]
            text = "; ".join(f"GPU {p['pair'][0]}<->{p['pair'][1]}: P2P {p['p2p_read']}, {p['topology']}" for p in peers)
            if bad:
                geforce = all(g.is_geforce for g in gpus)
                checks.append(Check(
                    "peer_to_peer", WARNING, text,
                    "without peer-to-peer, NCCL copies through host memory: prefer CFG parallel (Serving "
                    "Config's parallel_mode cfg, `--parallel cfg=2` on the command line; one exchange per step) "
                    "over Ulysses/tensor parallel (exchanges in every layer)"
                    + ("; GeForce cards do not support GPUDirect P2P (NVIDIA/nccl #1309)"
                       if geforce else "; check the BIOS (ACS/IOMMU) and `nvidia-smi topo -m`")
                    + "; if NCCL hangs, set NCCL_P2P_DISABLE=1", {"pairs": peers}))
            else:
                checks.append(Check("peer_to_peer", OK, text, details={"pairs": peers}))
        except Exception as exc:
            checks.append(Check("peer_to_peer", UNCHECKED, f"NVML could not report peer access ({exc})"))
    try:
        procs = processes_on_gpus(nvml, gpus)
        me = os.getpid()
        mine = {i: p for i, ps in procs.items() for p in ps if p["pid"] == me}
        if mine:
            held = ", ".join(f"GPU {i}: {p['used_gib']:.1f} GiB" if p["used_gib"] is not None else f"GPU {i}"
                             for i, p in mine.items())
            checks.append(Check("own_gpu_memory", WARNING,
                                f"this process (pid {me}, ComfyUI) holds GPU memory itself: {held}",
                                "that memory is not available to the server: unload ComfyUI's models "
                                "(Manager > Unload models, or start ComfyUI with --disable-smart-memory / "
                                "--cpu for the graph), or give the server other GPUs", {"pid": me}))
        else:
            checks.append(Check("own_gpu_memory", OK, f"this process (pid {me}) holds no GPU memory",
                                details={"pid": me}))
    except Exception as exc:
        checks.append(Check("own_gpu_memory", UNCHECKED, f"NVML could not list GPU processes ({exc})"))
    return checks, gpus, peers


def box_role(gpus: list[GpuInfo], absent: bool) -> str:
    """`gpus`: NVML's, else those VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB gives (a launch runs on those)."""
    return GPU_BOX if gpus else (CLIENT_ONLY if absent else GPUS_UNKNOWN)


def env_gpus(nvml_gpus: list[GpuInfo]) -> tuple[list[GpuInfo], Optional[Check]]:
    """The GPUs VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB gives, and what the doctor says of them: launches and
    `plan` use these sizes instead of NVML's (planner/launch_plan.py reads the variable), so the
    doctor judges the box by them too, and says where they came from."""
    try:
        sizes = env_gpu_memory()
    except LauncherError as exc:
        return [], Check("gpu_memory_env", PROBLEM, f"{exc.what}: {exc.why}", exc.fix)
    if sizes is None:
        return [], None
    source = sizes_source(sizes)
    listed = ", ".join(f"{s:g}" for s in sizes)
    if not nvml_gpus:
        return hypothetical_gpus(sizes, name=f"GPU from {GPU_MEMORY_ENV}"), Check(
            "gpu_memory_env", OK, f"{len(sizes)} GPU(s) of {listed} GiB from {GPU_MEMORY_ENV}, which NVML cannot "
            "see: launches and plans use these sizes", details={"sizes_gib": sizes})
    nvml_sizes = [g.total_gib for g in nvml_gpus]
    same = len(sizes) == len(nvml_sizes) and all(abs(a - b) <= 1.0 for a, b in zip(sizes, nvml_sizes))
    return [], Check("gpu_memory_env", OK if same else WARNING,
                     f"{source}: launches and plans use these sizes instead of NVML's "
                     f"({', '.join(f'{s:.1f}' for s in nvml_sizes)} GiB)",
                     "" if same else f"unset {GPU_MEMORY_ENV} (NVML sees the GPUs), or set it to their sizes",
                     {"sizes_gib": sizes})
