"""Issue 25's overhead verdict: our seconds per job beyond the server's, through the CLI and through the node.

CLI: the `levers --cli-jobs` report (bench/gpu/levers.py): per CLI job `ours_s` = the client's `decoded` (MP4
written, header checked) minus the server's `inference_time_s` (its task time: engine, postprocess, MP4 encode,
file save). Direct. There a client job of the same request runs first on the server, so the first job of a
fresh server comes from the CLI process itself (`generate --model ... --report-json`, `--cli-first`).

Node: the head-to-head report of our side (bench/gpu/native.py), which times the Generate Video node from
ComfyUI's websocket. Direct where the run has `server_inference_s` (the server's `inference_time_s`, from the
job line Generate Video logs to ComfyUI's console): ours = the node's seconds minus it, everything from the
node's start to its return that is not the server's job time, as the CLI's. Otherwise (a report from before
that line) an estimate: the node's seconds minus the server's parts the log shows (pipeline: text encode +
denoise + VAE decode; postprocess; MP4 encode) minus the server's rest (saving the file, scheduling), taken as
the median over the CLI call's jobs of `inference_time_s` minus the same parts, measured on the same machine
and shape. That is how the 0.30 levers report reached its "node ~0.44 s"; a job's own rest can be 0.02-0.03 s
above the median, so the estimate may overstate. Each row names its `method`.

    python -m bench.gpu.overhead_verdict --levers LEVERS.json --native REPORT.json [--cli-first REPORT.json]
        [--generate-node ID] --out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Optional

LIMIT_S = 0.3   # issue 25: overhead at 1280x704x121 under 0.3 s through the CLI and the node


def server_parts_s(stages: Optional[dict], postprocess: Optional[float], mp4: Optional[float]) -> Optional[float]:
    """The server's own seconds the log shows for one job (pipeline + postprocess + MP4 encode), None if any is
    missing. A job whose worker wrote the MP4 itself (0.30's `preencode_mp4`) logs a postprocess of 0 and no MP4
    encode line: its encode ran inside the pipeline's VAE decode, so the pipeline is all of it."""
    if not stages or stages.get("pipeline_s") is None or postprocess is None:
        return None
    if mp4 is None and float(postprocess) != 0.0:
        return None
    return float(stages["pipeline_s"]) + float(postprocess) + float(mp4 or 0.0)


def server_rest_s(levers: dict) -> Optional[float]:
    """Median over the levers report's jobs of `inference_time_s` minus the parts the log shows: what the server
    spends beyond them (file save, scheduling)."""
    rests = []
    for config in levers.get("configs", []):
        for job in config.get("jobs", []):
            inference = (job.get("timings") or {}).get("server_inference")
            parts = server_parts_s(job.get("server_stages"), job.get("postprocess_s"), job.get("mp4_encode_s"))
            if job.get("ok") and inference is not None and parts is not None:
                rests.append(float(inference) - parts)
    return round(statistics.median(rests), 3) if rests else None


def cli_rows(levers: dict) -> list[dict[str, Any]]:
    """Each CLI job: its steps, `ours_s`, and whether it was the first CLI job at its steps (in the levers call a
    client job of the same request runs first on the server, so no CLI job is the first of its kind there)."""
    rows, seen = [], set()
    for config in levers.get("configs", []):
        for job in config.get("jobs", []):
            if job.get("via") != "cli" or "skipped" in job:
                continue
            first = job.get("steps") not in seen
            seen.add(job.get("steps"))
            rows.append({"path": "cli", "steps": job.get("steps"), "first_cli_at_its_steps": first,
                         "ok": bool(job.get("ok")), "ours_s": job.get("ours_s")})
    return rows


def cli_first_row(report: dict) -> Optional[dict[str, Any]]:
    """The CLI process's own job (`generate --model`: a fresh server, so the first job of its kind there), from
    its --report-json; None when that call wrote none."""
    if not report:
        return None
    t = report.get("timings") or {}
    ok = t.get("decoded") is not None and t.get("server_inference") is not None
    return {"path": "cli", "run": "first job of a fresh server (the CLI process)", "first_cli_at_its_steps": True,
            "ok": ok, "ours_s": round(t["decoded"] - t["server_inference"], 3) if ok else None}


def node_rows(native: dict, generate_node: str, rest_s: Optional[float]) -> list[dict[str, Any]]:
    """Each successful run of our side: the Generate Video node's seconds minus the server's own job time where
    the run has it (direct), else minus the server's parts and the median rest (estimated)."""
    rows = []
    for run in native.get("runs", []):
        if run.get("side") != "ours":
            continue
        node_s = (run.get("node_s") or {}).get(str(generate_node))
        parts = server_parts_s(run.get("server_stages"), run.get("server_postprocess_s"),
                               run.get("server_mp4_encode_s"))
        inference = run.get("server_inference_s")
        server_s = inference if inference is not None else None if parts is None or rest_s is None else parts + rest_s
        ok = run.get("status") == "success" and node_s is not None and server_s is not None
        rows.append({"path": "node", "run": run.get("run"), "steps": run.get("steps"), "ok": ok,
                     "method": "direct" if inference is not None else "stage parts and median rest",
                     "node_s": node_s, "server_inference_s": inference,
                     "server_parts_s": None if parts is None else round(parts, 3),
                     "ours_s": round(node_s - server_s, 3) if ok else None})
    return rows


def verdict(rows: list[dict[str, Any]], limit_s: float = LIMIT_S) -> dict[str, Any]:
    """Under the limit on every measured job of both paths; no verdict while a path has no measured job."""
    out: dict[str, Any] = {"limit_s": limit_s}
    for path in ("cli", "node"):
        got = [r["ours_s"] for r in rows if r["path"] == path and r["ok"] and r["ours_s"] is not None]
        out[path] = {"jobs": len(got), "max_s": max(got) if got else None,
                     "failed": sum(1 for r in rows if r["path"] == path and not r["ok"])}
    missing = [p for p in ("cli", "node") if not out[p]["jobs"]]
    if missing:
        out["under_limit"] = None
        out["line"] = f"OVERHEAD VERDICT: none (no measured {' or '.join(missing)} job)"
        return out
    out["under_limit"] = all(out[p]["max_s"] < limit_s for p in ("cli", "node"))
    out["line"] = (f"OVERHEAD VERDICT: {'under' if out['under_limit'] else 'NOT under'} {limit_s:g} s: CLI max "
                   f"{out['cli']['max_s']:.3f} s ({out['cli']['jobs']} jobs), node max {out['node']['max_s']:.3f} s "
                   f"({out['node']['jobs']} runs)")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.overhead_verdict", description=__doc__.splitlines()[0])
    p.add_argument("--levers", help="levers.json of the `levers --cli-jobs` call (its CLI rows and the server rest)")
    p.add_argument("--rest-from", help="without --levers: a levers.json of another call on the same kind of machine "
                   "and server version, for the server rest alone (the CLI rows then come from --cli-first)")
    p.add_argument("--native", required=True, help="report.json of the head-to-head call (our side)")
    p.add_argument("--cli-first", help="--report-json of the CLI's `generate --model` job (bench/gpu/issue25.sh "
                   "cli-first), if it ran")
    p.add_argument("--generate-node", help="the Generate Video node's id in the template (default: the "
                   "ti2v-5b template's, read through bench/gpu/graphs.py)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if not a.levers and not a.rest_from:
        p.error("give --levers, or --rest-from for the server rest")
    levers = json.loads(Path(a.levers).read_text()) if a.levers and Path(a.levers).is_file() else {}
    native = json.loads(Path(a.native).read_text()) if Path(a.native).is_file() else {}
    node = a.generate_node
    if node is None:
        from .graphs import SETUPS, legacy

        lg = legacy()
        node = lg.node_of(lg.load_api(SETUPS["ti2v-5b"]["template"]), "VLLMOmniGenerateVideo")
    rest = server_rest_s(levers if a.levers else json.loads(Path(a.rest_from).read_text()))
    first = json.loads(Path(a.cli_first).read_text()) if a.cli_first and Path(a.cli_first).is_file() else {}
    rows = [r for r in [cli_first_row(first)] if r] + cli_rows(levers) + node_rows(native, str(node), rest)
    doc = dict(verdict(rows), server_rest_s=rest, rest_from=a.rest_from if not a.levers else None,
               generate_node=str(node), rows=rows)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "overhead-verdict.json").write_text(json.dumps(doc, indent=1))
    print(doc["line"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
