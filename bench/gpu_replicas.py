"""The replica bench's evidence and its README: which replica ran each job, the server's process
group, GPU memory per process, and the table of bench/throughput_bench.py runs.

bench/throughput_bench.py imports the helpers; `python bench/gpu_replicas.py DIR` writes DIR/README.md
from the throughput JSON files in DIR (phase R of bench/gpu_session.sh does, on the device).

Which replica ran a job comes from upstream's own log line, the same in vLLM-Omni 0.26 and 0.30
(`StageDiffusionClient.add_request_async`, diffusion/stage_diffusion_client.py):
`[StageDiffusionClient] stage-0 [rep-K] add request: <request id>`, where the request id is the
video job id (the API passes it to the engine unchanged). The README part needs the standard library
only (it runs under the device's server python).
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

ADD_REQUEST = re.compile(r"\[rep-(\d+)\] add request: (\S+)")
DEVICE_SPLIT = re.compile(r"replicas, devices_per_replica=\d+, devices split: .*")


def replica_of_jobs(log_text: str, job_ids: Iterable[str], replicas: int) -> dict[str, Optional[int]]:
    """Job id -> the replica whose `add request` line names it (None: no such line). One replica
    runs every job (upstream then serves it inline and logs its `add request` at debug level only)."""
    if replicas == 1:
        return {job: 0 for job in job_ids}
    adds = [(int(m.group(1)), m.group(2)) for m in ADD_REQUEST.finditer(log_text)]
    return {job: next((rep for rep, rid in reversed(adds) if job in rid), None) for job in job_ids}


def jobs_per_replica(replica_of: dict[str, Optional[int]]) -> dict[str, int]:
    """Replica index (as text, 'unknown' when the log did not say) -> jobs it ran."""
    counts: dict[str, int] = {}
    for rep in replica_of.values():
        key = "unknown" if rep is None else str(rep)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def log_evidence(log_text: str, limit: int = 12) -> list[str]:
    """The upstream lines that show the replica layout (the device split, each replica initialized)
    and the shim's rewrite, without terminal colours. Needs the package (the bench imported it)."""
    from vllm_omni_launcher.errors.redact import strip_control

    keep = [strip_control(line).strip() for line in log_text.splitlines()
            if DEVICE_SPLIT.search(line) or "[gpu_replicas_shim]" in line or "] initialized" in line]
    return keep[:limit]


def gpu_mib_by_pid(lines: Any) -> dict[int, int]:
    """nvidia-smi `--query-compute-apps=pid,used_memory --format=csv,noheader` lines -> pid: MiB."""
    out: dict[int, int] = {}
    for line in lines if isinstance(lines, list) else []:
        parts = [p.strip() for p in str(line).split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            digits = re.match(r"\d+", parts[1])
            if digits:
                out[int(parts[0])] = int(digits.group())
    return out


def group_members(pgid: Optional[int]) -> list[dict[str, Any]]:
    """Every live process of the server's process group (the watchdog, the server, its replicas
    and their workers): pid, parent, name and the start of its command line."""
    import psutil

    if pgid is None:
        return []
    members = []
    for proc in psutil.process_iter(["pid", "ppid", "name", "cmdline", "status"]):
        try:
            if os.getpgid(proc.pid) != pgid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
        cmd = " ".join(proc.info["cmdline"] or [])
        members.append({"pid": proc.pid, "ppid": proc.info["ppid"], "name": proc.info["name"], "cmd": cmd[:160]})
    return sorted(members, key=lambda m: m["pid"])


def still_alive(pids: Iterable[int]) -> list[int]:
    """The given pids that still run (not zombies)."""
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive


# ----------------------------------------------------------------------------- the README
def _gib(mib: Any) -> str:
    return f"{mib / 1024:.1f}" if isinstance(mib, (int, float)) else "-"


def _row(report: dict[str, Any], row: dict[str, Any]) -> str:
    if "skipped" in row or "error" in row:
        why = row.get("skipped") or row.get("error")
        return f"| {report.get('label', '')} | {row['replicas']} | {why} | | | | | | | |"
    split = ", ".join(f"rep {k}: {v}" for k, v in row.get("jobs_per_replica", {}).items()) or "-"
    procs = row.get("processes", {})
    stopped = procs.get("left_after_stop")
    stop_text = "-" if stopped is None else ("none left" if not stopped else f"{len(stopped)} LEFT")
    return (f"| {report.get('label', '')} | {row['replicas']} | {row.get('start_to_ready_s', '-')} | "
            f"{row['jobs']} in {row['wall_s']} s | {row['jobs_per_min']} | {row.get('speedup_vs_first', '-')}x | "
            f"{', '.join(str(s) for s in row.get('job_s', []))} | {split} | "
            f"{_gib(row.get('nvml_peak_mib'))} | {len(procs.get('replica_pids', []))} found, {stop_text} |")


def run_header(report: dict[str, Any], request_detail: str, *extra: str) -> list[str]:
    """The heading and facts of one run in a bench README (shared with gpu_join_report.py): what ran,
    against which server versions, with which request, on which machine."""
    server = report.get("server_versions") or {}
    machine = report.get("machine", {})
    return [f"## {report.get('label', report.get('model'))}", "",
            f"- command: `{report.get('command')}`",
            f"- server: {report.get('server')}; vllm {server.get('vllm', '?')}, vllm-omni {server.get('vllm_omni', '?')}",
            f"- request: {report.get('request')}, {request_detail}", *extra,
            f"- machine: {machine.get('gpu') or machine.get('platform')}", ""]


def render_readme(reports: list[dict[str, Any]]) -> str:
    """README.md for a folder of throughput JSON reports: one table row per (run, replica count)."""
    lines = ["# Replicas on one GPU: jobs per minute, 1 replica against 2 (bench/throughput_bench.py)", "",
             "Written by `python bench/gpu_replicas.py DIR` from the JSON files beside it. Each run starts the",
             "server through our Supervisor (its process group, replica watch and Stop), submits N jobs at once",
             "and times first POST to last job completed (GET /v1/videos/{id} says `completed`, so the MP4 is",
             "encoded and stored). Which replica ran a job is upstream's `[rep-K] add request` log line.", ""]
    for report in reports:
        lines += run_header(report, f"{report.get('steps')} steps; {report.get('jobs')} jobs at once after one "
                                    f"warm-up job per replica; polls every {report.get('poll_s')} s",
                            f"- replica layout: {report.get('layout')}")
        if report.get("interrupted"):
            lines += [f"**Cut short**: {report['interrupted']}", ""]
    lines += ["| run | replicas | ready after (s) | jobs | jobs/min | vs 1 | jobs finished after (s) | "
              "jobs per replica | GPU 0 peak (GiB) | replica processes, after Stop |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for report in reports:
        lines += [_row(report, row) for row in report.get("results", [])]
    notes = [f"- {report.get('label')}, {row['replicas']} replica(s): GPU memory by process (MiB): "
             f"{row['gpu_mib_by_pid']}" for report in reports for row in report.get("results", [])
             if row.get("gpu_mib_by_pid")]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python bench/gpu_replicas.py DIR   (writes DIR/README.md from DIR/*.json)", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    reports = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("bench") == "throughput_bench":
            reports.append(data)
    (folder / "README.md").write_text(render_readme(reports))
    print(f"wrote {folder / 'README.md'} ({len(reports)} run(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
