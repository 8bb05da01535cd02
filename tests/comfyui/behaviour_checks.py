"""How the pack behaves in a real ComfyUI: caching and Cancel during a launch.

Used by ``test_real_comfyui.py`` and ``run_real_comfyui.py``; no pytest needed. Every check
drives a running ``comfy_harness.ComfyUI`` whose launcher points at the stub vLLM-Omni
server (``run_real_comfyui.launcher_env``) and raises AssertionError saying what ComfyUI did
when the behaviour is wrong.

What the stub received is read from the server's own log, which the launcher writes under
its data dir (``<data_dir>/logs/*.log``, one file per server start): upstream's uvicorn
access line ``"POST /v1/videos HTTP/1.1" 200`` per submitted job, and the stub's
``STUB_PID=<pid>`` line for the process that served it. A remote server's jobs are counted
in the log of a stub this process started (``stubserver.run_stub``).

What the nodes show in the front end (text, progress bars, screenshots) is node_display_checks.py's.
"""
from __future__ import annotations

import copy
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Optional

from cancel_latency import LAUNCH_CANCEL_S
from comfy_harness import WORKFLOWS, ComfyUI

TI2V_TEMPLATE = "wan22_ti2v_5b_text_to_video"
REMOTE_TEMPLATE = "remote_server"
TINY = {"width": 64, "height": 64, "frames": 5, "steps": 2}
REMOTE_MODEL = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"      # what the remote template's model_family names
# The issue asks Cancel to stop a launch within 2 s; the bound every launch-cancel test asserts.
CANCEL_BOUND_S = LAUNCH_CANCEL_S
STEP_S = 0.5            # the stub's seconds per denoise step: long enough to see Generate mid-denoise
LOAD_DELAY_S = 900.0    # the slow stub's weight loading: a launch that never finishes by itself

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
JOB_LINE = re.compile(r'"POST /v1/videos HTTP/1\.[01]" \d{3}')   # uvicorn's access log, one per job
STUB_PID = re.compile(r"STUB_PID=(\d+)")
IN_LOAD = "Initialized device and distributed environment"        # the stub's worker is loading weights


def count_jobs(log_text: str) -> int:
    """Video jobs a vLLM-Omni server's log says it received (POST /v1/videos, any answer)."""
    return len(JOB_LINE.findall(_ANSI.sub("", log_text)))


class LauncherLogs:
    """The server logs the launcher keeps in its data dir: what the stub received, and from whom."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "logs"

    def files(self) -> list[Path]:
        return sorted(self.dir.glob("*.log"), key=lambda p: p.stat().st_mtime) if self.dir.is_dir() else []

    def text(self) -> str:
        return "".join(_ANSI.sub("", p.read_text(errors="replace")) for p in self.files())

    def jobs(self) -> int:
        return count_jobs(self.text())

    def loads(self) -> int:
        """How many weight loads (IN_LOAD lines) the logs show. The folder keeps earlier launches' logs, so
        a launch's own load is a count above the one taken before it was queued."""
        return self.text().count(IN_LOAD)

    def wait_new_load(self, loads_before: int, timeout: float, between: Callable[[], None]) -> None:
        """Until a load beyond `loads_before` (`loads()` before the launch was queued) is in the logs;
        `between` runs on every poll: the caller's checks that the launch is still on, and its wait."""
        deadline = time.monotonic() + timeout
        while self.loads() <= loads_before:
            assert time.monotonic() < deadline, f"the stub never reached weight loading; log:\n{self.text()[-3000:]}"
            between()

    def server_pids(self) -> list[int]:
        """The pid each server start printed first (stage subprocesses print theirs later)."""
        pids = []
        for path in self.files():
            m = STUB_PID.search(path.read_text(errors="replace"))
            if m:
                pids.append(int(m.group(1)))
        return pids


# --------------------------------------------------------------------------- processes
def _stat(pid: int) -> Optional[tuple[str, int]]:
    """(state, process group) of a pid from /proc, or None when there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2])


def live_members(server_pid: int, pgid: int) -> list[int]:
    """Processes of the server still running: the pid itself and its process group (zombies are gone)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st is not None and st[0] != "Z" and (int(entry) == server_pid or st[1] == pgid):
            pids.append(int(entry))
    return pids


# --------------------------------------------------------------------------- prompts
def load_api(name: str) -> dict:
    return json.loads((WORKFLOWS / "api" / f"{name}.api.json").read_text())


def node_of(prompt: dict, class_type: str) -> str:
    return next(k for k, e in prompt.items() if e["class_type"] == class_type)


def ti2v_prompt(seed: int, **generate: Any) -> dict:
    """The TI2V text-to-video template's API twin, shrunk to a tiny job, with this seed."""
    prompt = copy.deepcopy(load_api(TI2V_TEMPLATE))
    prompt[node_of(prompt, "VLLMOmniGenerateVideo")]["inputs"].update({**TINY, "seed": seed, **generate})
    return prompt


def remote_prompt(url: str, seed: int) -> dict:
    """The remote template's API twin pointed at ``url``, tiny job, this seed."""
    prompt = copy.deepcopy(load_api(REMOTE_TEMPLATE))
    prompt[node_of(prompt, "VLLMOmniRemoteServer")]["inputs"]["url"] = url
    prompt[node_of(prompt, "VLLMOmniGenerateVideo")]["inputs"].update({**TINY, "seed": seed})
    return prompt


def messages(entry: dict) -> dict[str, dict]:
    """/history status messages by type (execution_start, execution_cached, execution_success, ...)."""
    return {kind: data for kind, data in entry.get("status", {}).get("messages", [])}


def executed_nodes(prompt: dict, entry: dict) -> list[str]:
    """'id ClassType' of the nodes ComfyUI ran for this prompt (all minus those it took from its cache)."""
    cached = set(messages(entry).get("execution_cached", {}).get("nodes", []))
    return [f"{k} {prompt[k]['class_type']}" for k in sorted(prompt, key=int) if k not in cached]


def run_to_success(comfy: ComfyUI, prompt: dict, timeout: float = 900.0) -> dict:
    return run_queued(comfy, comfy.queue(prompt), timeout)


def run_queued(comfy: ComfyUI, prompt_id: str, timeout: float = 900.0) -> dict:
    """Wait for a queued prompt; its /history entry (AssertionError with ComfyUI's log unless it succeeded)."""
    entry = comfy.wait_history(prompt_id, timeout=timeout, poll=0.25)
    st = entry["status"]
    assert st["status_str"] == "success" and st["completed"], \
        f"prompt failed: {json.dumps(st, indent=1)[:6000]}\nComfyUI log tail:\n{comfy.log()[-4000:]}"
    return entry


# --------------------------------------------------------------------------- caching
def check_same_graph_twice(comfy: ComfyUI, count: Callable[[], int], prompt: dict) -> dict:
    """Queue ``prompt`` twice: the server gets one job; the second queue runs nothing.

    ``count()`` is how many jobs the server received so far.
    """
    before = count()
    first = run_to_success(comfy, prompt)
    after_first = count()
    assert after_first - before == 1, \
        f"the first queue of a new graph sent {after_first - before} jobs (expected 1); " \
        f"ComfyUI ran {executed_nodes(prompt, first)}"
    second = run_to_success(comfy, prompt)
    after_second = count()
    rerun = executed_nodes(prompt, second)
    assert after_second == after_first, \
        f"the same graph queued again sent {after_second - after_first} more job(s) to the server " \
        f"(2 queues -> {after_second - before} jobs, expected 1): ComfyUI re-ran {rerun} instead of " \
        f"taking them from its cache (an IS_CHANGED that changes between runs, or NaN, re-runs a node " \
        f"and everything downstream of it)"
    assert not rerun, f"no job was sent, but ComfyUI still re-ran {rerun}"
    return {"jobs": after_second - before, "second_queue_ran": rerun}


def check_changed_seed(comfy: ComfyUI, count: Callable[[], int], base: dict, changed: dict,
                       server_pids: Optional[Callable[[], list[int]]] = None) -> dict:
    """After ``base`` ran, ``changed`` (another seed) costs exactly one more job, re-runs only the
    nodes the seed feeds, and (local) reuses the running server process."""
    run_to_success(comfy, base)
    jobs0 = count()
    pids0 = server_pids() if server_pids else []
    entry = run_to_success(comfy, changed)
    jobs1 = count()
    ran = executed_nodes(changed, entry)
    gen = node_of(changed, "VLLMOmniGenerateVideo")
    feeds = {f"{k} {changed[k]['class_type']}" for k in _downstream(changed, gen)}
    assert jobs1 - jobs0 == 1, f"a changed seed sent {jobs1 - jobs0} job(s), expected 1; ComfyUI ran {ran}"
    assert set(ran) == feeds, f"a changed seed re-ran {ran}; only the nodes it feeds {sorted(feeds)} should run"
    report: dict[str, Any] = {"jobs_for_both": jobs1 - jobs0 + 1, "ran": ran}
    if server_pids is not None:
        pids1 = server_pids()
        assert pids1 == pids0 and len(pids1) == 1, \
            f"the server was started again: server pids in the launcher's logs {pids0} -> {pids1}"
        assert live_members(pids1[0], pids1[0]), f"the server process {pids1[0]} is gone"
        report["server_pid"] = pids1[0]
    return report


def check_remote_requeue(comfy: ComfyUI) -> dict:
    """The remote template against a stub started here: the same graph twice -> 1 job, a new seed -> 1 more."""
    import stubserver   # tests/contract (run_real_comfyui puts it on the path)

    with stubserver.run_stub(REMOTE_MODEL, env={"VLLM_OMNI_STUB_STEP_S": str(STEP_S)}) as stub:
        stub.wait_healthy()

        def jobs() -> int:
            return count_jobs(stub.output_text())
        twice = check_same_graph_twice(comfy, jobs, remote_prompt(stub.url, seed=4004))
        changed = check_changed_seed(comfy, jobs, remote_prompt(stub.url, seed=4004), remote_prompt(stub.url, seed=4005))
    return {"same_graph_twice": twice, "changed_seed": changed}


def _downstream(prompt: dict, start: str) -> set[str]:
    """``start`` and every node that takes (indirectly) one of its outputs."""
    found, grew = {start}, True
    while grew:
        grew = False
        for k, e in prompt.items():
            links = {v[0] for v in e["inputs"].values() if isinstance(v, list) and len(v) == 2}
            if k not in found and links & found:
                found.add(k)
                grew = True
    return found


# --------------------------------------------------------------------------- cancel
def wait_server_process(comfy: ComfyUI, logs: LauncherLogs, known: list[int], prompt_id: str,
                        timeout: float = 300.0) -> int:
    """The pid of a server start that is not in ``known`` (the launcher just started it for ``prompt_id``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [p for p in logs.server_pids() if p not in known]
        if new:
            return new[-1]
        assert comfy.proc.poll() is None, f"ComfyUI exited; log tail:\n{comfy.log()[-4000:]}"
        ended = comfy.get(f"/history/{prompt_id}").get(prompt_id)
        assert not ended, f"the prompt ended before any server process started: " \
                          f"{json.dumps(ended.get('status', {}))[:4000]}"
        time.sleep(0.2)
    raise AssertionError(f"no server process started within {timeout:.0f}s; ComfyUI log tail:\n{comfy.log()[-4000:]}")


def check_interrupt_during_launch(comfy: ComfyUI, logs: LauncherLogs, seed: int, timeout: float = 300.0) -> dict:
    """/interrupt once a Local Server launch is loading weights (the stub loads for minutes): the
    prompt ends as interrupted within CANCEL_BOUND_S, and the server's process group is gone as fast."""
    known, loads_before = logs.server_pids(), logs.loads()
    prompt = ti2v_prompt(seed)
    prompt_id = comfy.queue(prompt)
    pid = wait_server_process(comfy, logs, known, prompt_id)
    st = _stat(pid)
    pgid = st[1] if st is not None else pid

    def still_launching() -> None:
        assert not comfy.get(f"/history/{prompt_id}"), "the prompt ended before the stub loaded weights"
        time.sleep(0.1)

    logs.wait_new_load(loads_before, timeout, still_launching)
    assert not comfy.get(f"/history/{prompt_id}"), "the prompt ended before the interrupt (the launch was too short)"
    assert live_members(pid, pgid), f"the server process {pid} died by itself before the interrupt"
    sent = time.monotonic()
    comfy.interrupt(prompt_id)
    entry = comfy.wait_history(prompt_id, timeout=120, poll=0.05)
    ended_s = time.monotonic() - sent
    left: list[int] = live_members(pid, pgid)
    while left and time.monotonic() - sent < 60:
        time.sleep(0.05)
        left = live_members(pid, pgid)
    gone_s = time.monotonic() - sent
    kinds = messages(entry)
    assert "execution_interrupted" in kinds, \
        f"the prompt did not end as interrupted: {entry['status'].get('status_str')} {list(kinds)} " \
        f"{json.dumps(kinds.get('execution_error', {}))[:1500]}"
    in_log = logs.text()
    report = {"server_pid": pid, "prompt_ended_s": round(ended_s, 2), "server_gone_s": round(gone_s, 2),
              "loading_when_interrupted": IN_LOAD in in_log}
    assert ended_s < CANCEL_BOUND_S, \
        f"the prompt ended {ended_s:.1f}s after /interrupt (must be < {CANCEL_BOUND_S}s): the Local " \
        f"Server node does not watch Cancel while it waits for the server; {report}"
    assert not left, f"server processes {left} still run {gone_s:.0f}s after the interrupt; {report}"
    assert gone_s < CANCEL_BOUND_S, f"the server's processes took {gone_s:.1f}s to go after /interrupt; {report}"
    return report
