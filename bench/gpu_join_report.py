"""The head + joined-replica bench's evidence and its README (bench/gpu_join.py, phase J of bench/gpu_session.sh).

Which runtime ran a job comes from the head's own log, the same lines in vLLM-Omni 0.26 and 0.30:
the head attaches a joined runtime's replica with
`[MembershipController] attached remote replica stage=0 replica=K addr=...` and sends each job
with `[StageDiffusionClient] stage-0 [rep-K] add request: <job id>` (the request id is the video
job id). A job whose replica K was attached as remote ran in the joined runtime, any other replica
is the head's own. The joined runtime's log names no job; it shows its denoise progress bars
(tqdm: `100%|...| S/S [...]`), so its count of finished S-step bars is the number of jobs it ran,
a cross-check of the head's routing.

`python bench/gpu_join_report.py DIR` writes DIR/README.md from DIR/*.json. Standard library only
(it runs under the device's server python).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_replicas import ADD_REQUEST, run_header  # noqa: E402 (the replica bench's routing-line parser, README heading)

ATTACHED = re.compile(r"attached remote replica stage=\d+ replica=(\d+)")
BAR = re.compile(r"\d+%\|[^|\r\n]*\|\s*(\d+)/(\d+) \[")
EVIDENCE = ("attached remote replica", "registered with OmniCoordinator", "add request", "detach",
            "heartbeat", "vllm-omni-launcher:", "Available routes")
HEAD, JOINED = "head", "joined"


def remote_replicas(head_log: str) -> set[int]:
    """Replica ids the head attached as remote (a joined runtime's replicas, every generation)."""
    return {int(m.group(1)) for m in ATTACHED.finditer(head_log)}


def runtime_of_jobs(head_log: str, job_ids: Iterable[str], local_replicas: int = 1) -> dict[str, Optional[str]]:
    """Job id -> HEAD or JOINED, from the head's last `add request` line naming it (None: no line).
    A head that logged no `attached remote replica` line (a version that words it otherwise) counts
    replica ids from `local_replicas` up as remote: its own replicas are 0..local_replicas-1."""
    adds = [(int(m.group(1)), m.group(2)) for m in ADD_REQUEST.finditer(head_log)]
    remote = remote_replicas(head_log) or {rep for rep, _ in adds if rep >= local_replicas}
    out: dict[str, Optional[str]] = {}
    for job in job_ids:
        rep = next((r for r, rid in reversed(adds) if job in rid), None)
        out[job] = None if rep is None else (JOINED if rep in remote else HEAD)
    return out


def jobs_per_runtime(runtime_of: dict[str, Optional[str]]) -> dict[str, int]:
    """HEAD / JOINED / 'unknown' -> jobs it ran."""
    counts: dict[str, int] = {}
    for runtime in runtime_of.values():
        key = runtime or "unknown"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def finished_runs(log_text: str, steps: int) -> int:
    """Denoise progress bars of `steps` steps that reached S/S in a runtime's log: one per job it ran.
    A bar counts when it reaches S/S after a redraw short of S/S (tqdm always draws 0/S first), so the
    finished bar that tqdm's close prints again counts once."""
    count, open_bar = 0, False
    for m in BAR.finditer(log_text):
        done, total = int(m.group(1)), int(m.group(2))
        if total != steps:
            continue
        if done < total:
            open_bar = True
        elif open_bar:
            count, open_bar = count + 1, False
    return count


def evidence(log_text: str, limit: int = 16) -> list[str]:
    """The upstream (and launcher) lines that show registration, routing and the restarts, without
    terminal colours, at most `limit` of them (the first half and the last half when more)."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", log_text)
    keep = [line.strip()[:240] for line in re.split(r"[\r\n]+", text) if any(k in line for k in EVIDENCE)]
    return keep if len(keep) <= limit else keep[:limit // 2] + ["..."] + keep[-(limit // 2):]


def gpu_mib_by_runtime(by_pid: dict[int, int], groups: dict[str, Iterable[int]]) -> dict[str, int]:
    """pid: MiB folded into runtime name -> MiB, by which process group (its pids) a pid belongs to."""
    out: dict[str, int] = {}
    for pid, mib in by_pid.items():
        name = next((n for n, pids in groups.items() if pid in set(pids)), "other")
        out[name] = out.get(name, 0) + mib
    return out


# ----------------------------------------------------------------------------- the README
STEP_NAMES = {"head": "1. head ready (head role, own replica on GPU 0)",
              "join": "2. joined replica registered (join role, GPU 0)",
              "jobs": "3. jobs through the head",
              "kill": "4. kill -9 of the joined runtime, restarts",
              "after": "4b. jobs after the restarts",
              "stop": "5. stop of both"}


BULKY = ("status", "t_s", "per_job", "argv", "ready_text", "registered_lines", "head_last_error", "gpu_memory",
         "wedge_jobs", "wedge_job_states", "log_tail", "head_tail", "gpu_processes_after_stop")


def _detail(step: dict[str, Any]) -> str:
    """A step's short facts (the bulky ones are in the JSON), without pipes that would break the table."""
    parts = [f"{k} {json.dumps(v, default=str)}" for k, v in step.items() if k not in BULKY]
    return "; ".join(parts)[:500].replace("|", "/")


def _notes(report: dict[str, Any]) -> list[str]:
    """GPU memory per runtime, and which runtime ran each job, per step."""
    out = []
    for key, step in report.get("steps", {}).items():
        memory = (step.get("gpu_memory") or {}).get("by_runtime_mib")
        if memory:
            out.append(f"- {key}: GPU memory by runtime (MiB): {json.dumps(memory)}")
        runs = [job.get("runtime") or "unknown" for job in step.get("per_job", [])]
        if runs:
            out.append(f"- {key}: runtime of each job in submit order: {', '.join(runs)}")
        if step.get("wedge_job_states"):
            out.append(f"- {key}: the jobs sent after the kill, at the end: {json.dumps(step['wedge_job_states'])}"
                       .replace("|", "/")[:400])
    return out


def render_readme(reports: list[dict[str, Any]]) -> str:
    """README.md for a folder of gpu_join JSON reports: one table per run, a row per step."""
    lines = ["# A head and a joined replica on one GPU (bench/gpu_join.py)", "",
             "Written by `python bench/gpu_join_report.py DIR` from the JSON files beside it. One Python driver",
             "runs both roles as our Supervisor objects: the head through `HeadRole` (what `serve",
             "--accept-replicas PORT` runs, registration on 127.0.0.1) and the replica through `JoinRole` (what",
             "`serve --join 127.0.0.1:PORT` runs), both on GPU 0. Jobs go to the head's /v1/videos through our",
             "VideoClient; which runtime ran each is the head's `[rep-K] add request` line against its",
             "`attached remote replica ... replica=K` lines, cross-checked by the joined runtime's own finished",
             "denoise bars. Times are seconds from the driver's start.", ""]
    for report in reports:
        lines += run_header(report, f"{report.get('denoise_steps')} steps; head_stall_timeout_s "
                                    f"{report.get('stall_s')}; deadline {report.get('deadline_s')} s")
        if report.get("interrupted"):
            lines += [f"**Cut short**: {report['interrupted']}", ""]
        lines += ["| step | status | at (s) | what happened |", "|---|---|---|---|"]
        for key, step in report.get("steps", {}).items():
            lines.append(f"| {STEP_NAMES.get(key, key)} | {step.get('status')} | {step.get('t_s', '-')} | "
                         f"{_detail(step)} |")
        notes = _notes(report)
        lines += [""] + notes + ([""] if notes else [])
    return "\n".join(lines)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python bench/gpu_join_report.py DIR   (writes DIR/README.md from DIR/*.json)", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    found = [_json(path) for path in sorted(folder.glob("*.json"))]
    reports = [r for r in found if isinstance(r, dict) and r.get("bench") == "gpu_join"]
    (folder / "README.md").write_text(render_readme(reports))
    print(f"wrote {folder / 'README.md'} ({len(reports)} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
