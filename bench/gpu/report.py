"""Markdown tables from a results folder: the head-to-head (native/report.json) and the calibration
(calibration.json), ratios ours / native measured in the same run."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional


def _f(x: Any, digits: int = 2) -> str:
    return "-" if x is None else (f"{x:.{digits}f}" if isinstance(x, (int, float)) else str(x))


def _ratio(ours: Optional[float], native: Optional[float]) -> Optional[float]:
    return None if not ours or not native else ours / native


def side_figures(run: dict) -> dict[str, Optional[float]]:
    """One run's comparable figures: end to end, s/step, text encode, VAE decode, peak GPU, host RAM."""
    n = run.get("node_s", {})
    if run["side"] == "native":
        s = run.get("sampler") or {}
        text = (n.get("6") or 0) + (n.get("7") or 0) or None
        decode, per_step = n.get("8"), s.get("s_per_step")
    else:
        st = run.get("server_stages") or {}
        text, decode = st.get("text_encode_s"), st.get("vae_decode_s")
        per_step = st["denoise_s"] / st["steps"] if st.get("steps") else None
    peak = run.get("nvml_peak_mib")
    ram = run.get("host_ram") or {}
    return {"end_to_end_s": run.get("end_to_end_s"), "s_per_step": per_step, "text_encode_s": text,
            "vae_decode_s": decode, "peak_gib": peak / 1024 if isinstance(peak, (int, float)) else None,
            "host_ram_gib": ram.get("total_gib")}


def head_to_head_table(report: dict, key: str = "run") -> str:
    """ours / native per run label (`key` "run"), or per `pair` (the combined table of several calls)."""
    runs = {(r["side"], r[key]): r for r in report.get("runs", []) if r.get("status") == "success" and key in r}
    labels = sorted({r for _, r in runs}, key=lambda x: (x != "first", x != "warm", x)) if key == "run" else \
        sorted({r for _, r in runs}, key=_pair_order)
    rows = ["| run | figure | ComfyUI native | ours (vLLM-Omni) | ours / native |", "|---|---|---|---|---|"]
    for label in labels:
        nat, our = runs.get(("native", label)), runs.get(("ours", label))
        fn, fo = (side_figures(nat) if nat else {}), (side_figures(our) if our else {})
        for key, name in (("end_to_end_s", "end to end (s)"), ("s_per_step", "s / denoise step"),
                          ("text_encode_s", "text encode (s)"), ("vae_decode_s", "VAE decode (s)"),
                          ("peak_gib", "peak GPU (GiB, NVML)"), ("host_ram_gib", "host RAM (GiB, RSS)")):
            r = _ratio(fo.get(key), fn.get(key))
            rows.append(f"| {label} | {name} | {_f(fn.get(key))} | {_f(fo.get(key))} | {_f(r)} |")
    return "\n".join(rows)


def _pair_order(pair: str) -> tuple:
    """default first, then the other settings by name (fast, lora4: the 4-step LoRA pair) each in a block of
    its own, then first / warm / warmup, then steps (a pair: "default warm 20 steps")."""
    speed, kind, steps, _ = pair.split(" ")
    return speed != "default", speed, ("first", "warm", "warmup").index(kind), int(steps)


def combined(folder: Path) -> tuple[dict, list[str]]:
    """Every head-to-head report under `folder` (one per device call: `--sides ours`, `--sides native`, ...)
    as one report of paired runs, and a line per source (its card and ComfyUI flags). Reports of more than one
    machine are refused: a ratio pairs runs of one machine (each report's boot id and GPU UUIDs)."""
    runs, sources, machines = [], [], {}
    for path in sorted(folder.rglob("report*.json")):
        rep = json.loads(path.read_text())
        args = rep.get("args", {})
        who = machine_identity(rep.get("machine", {}))
        machines.setdefault(who, []).append(str(path.relative_to(folder)))
        sources.append(f"- `{path.relative_to(folder)}`: {rep.get('machine', {}).get('gpu', 'no GPU')}; family "
                       f"{args.get('family', 'ti2v-5b')}; sides {args.get('sides')}; ComfyUI flags "
                       f"{' '.join(args.get('comfy_arg') or []) or 'none'}")
        runs += rep.get("runs", [])
        sources += [f"  - our plan ({r['run']}): " + "; ".join(plan_lines(r)) for r in rep.get("runs", [])
                    if plan_lines(r)]
    if len(machines) > 1:   # several machines, or recorded identities beside reports that have none
        raise SystemExit(f"{folder}: these reports do not all come from one machine, and a ratio is only "
                         "measured when both sides ran on one: " + "; ".join(
                             f"{', '.join(paths)} ({who or 'no machine identity recorded'})"
                             for who, paths in machines.items())
                         + ". Move the reports of other machines to a folder of their own.")
    if "" in machines:
        sources.append("- machine identity not recorded in these reports (made before boot ids were): the "
                       "folder's README says whether they ran on one machine")
    return {"runs": runs}, sources


def machine_identity(machine: dict) -> str:
    """Who ran a report: boot id and GPU UUIDs (common.machine); "" for reports made before they were kept."""
    return " ".join(x for x in (machine.get("boot_id"), machine.get("gpu_uuids")) if x)


def plan_lines(run: dict) -> list[str]:
    """What the planner chose for our run (Local Server's text: the configuration and its command line)."""
    text = (run.get("local_server_texts") or [""])[-1]
    return [line.strip() for line in text.splitlines() if line.startswith(("Recommended:", "  vllm serve"))]


def runs_table(report: dict) -> str:
    """Every run of a head-to-head with variants (native.py --native-variants / --ours-variants): end to end
    without the PNG sample save (nodes 94/95, both sides alike), s/step, text encode, VAE decode, NVML peak."""
    rows = ["| side | run | end to end s (no PNG save) | s / step | text encode s | VAE decode s | peak GiB (NVML) |",
            "|---|---|---|---|---|---|---|"]
    for r in report.get("runs", []):
        if r.get("status") != "success":
            continue
        f = side_figures(r)
        n = r.get("node_s", {})
        e2e = r.get("end_to_end_s")
        e2e = None if e2e is None else e2e - (n.get("94") or 0) - (n.get("95") or 0)
        rows.append(f"| {r['side']} | {r['run']} | {_f(e2e)} | {_f(f['s_per_step'], 3)} | {_f(f['text_encode_s'])} "
                    f"| {_f(f['vae_decode_s'])} | {_f(f['peak_gib'])} |")
    return "\n".join(rows)


def levers_table(report: dict) -> str:
    """Our levers (levers.json): per configuration and job, ready, s/step, the server's parts, our part, peak,
    PSNR against eager."""
    rows = ["| config | via | steps | ready s | s / step | denoise s | VAE decode s | postprocess s | MP4 encode s "
            "| job wall s | ours s | peak GiB | PSNR dB vs eager |", "|" + "---|" * 13]
    for c in report.get("configs", []):
        for j in c.get("jobs", []):
            if "skipped" in j or not j.get("ok"):
                continue
            st = j.get("server_stages") or {}
            peak = j.get("nvml_peak_mib")
            rows.append(f"| {c['config']} | {j['via']} | {j['steps']} | {_f(c.get('ready_s'), 1)} "
                        f"| {_f(j.get('tqdm_s_per_step'))} | {_f(st.get('denoise_s'))} | {_f(st.get('vae_decode_s'))} "
                        f"| {_f(j.get('postprocess_s'))} | {_f(j.get('mp4_encode_s'))} "
                        f"| {_f((j.get('timings') or {}).get('decoded'))} | {_f(j.get('ours_s'), 3)} "
                        f"| {_f(peak / 1024 if isinstance(peak, (int, float)) else None)} "
                        f"| {_f(j.get('psnr_db_vs_eager'))} |")
    return "\n".join(rows)


def calibration_table(report: dict) -> str:
    held = set(report.get("held_back", []))
    rows = ["| config | shape | cap GiB | ok | NVML peak GiB | planner GiB | pred/meas | s/step | decode s | job s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for c in report.get("configs", []):
        for j in c.get("jobs", []):
            if "skipped" in j:
                continue
            shape = "x".join(map(str, j["shape"])) + (" (held back)" if "x".join(map(str, j["shape"])) in held else "")
            st = j.get("server_stages") or {}
            pm = j.get("planner_peak_gib")
            meas = j.get("nvml_peak_gib") if isinstance(j.get("nvml_peak_gib"), (int, float)) else None
            rows.append(f"| {c['config']} | {shape} | {_f(j.get('cap_gib'))} | {'yes' if j.get('ok') else 'OOM' if j.get('oom') else 'no'} "
                        f"| {_f(meas)} | {_f(pm)} | {_f(_ratio(pm, meas))} | {_f(j.get('seconds_per_step'))} "
                        f"| {_f(st.get('vae_decode_s'))} | {_f(j.get('wall_s'))} |")
    return "\n".join(rows)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="markdown tables of a results folder")
    p.add_argument("folder")

    def run(a: Any) -> int:
        folder = Path(a.folder)
        paired, sources = combined(folder)
        if any("pair" in r for r in paired["runs"]):
            print("### combined: ours / native per pair of runs\n\n" + "\n".join(sources) + "\n\n"
                  + head_to_head_table(paired, key="pair") + "\n")
        for pattern, fn in (("report.json", head_to_head_table), ("native-*.json", runs_table),
                            ("calibration.json", calibration_table), ("levers*.json", levers_table)):
            for path in sorted(folder.rglob(pattern)):
                print(f"### {path.relative_to(folder)}\n\n{fn(json.loads(path.read_text()))}\n")
        return 0

    p.set_defaults(fn=run)


CONFIG_MEMORY = {"none": ("none", False), "tiling": ("none", True), "layerwise": ("layerwise", False),
                 "layerwise_tiling": ("layerwise", True), "module": ("module", False),
                 "module_tiling": ("module", True)}


def calibration_points(sources: list[tuple[str, dict]], held_back: set[str], no_fit: set[str]) -> dict:
    """The planner's points from calibration.json files: one per uncapped job, valid when it is the first
    job of its server or its peak differs from every earlier job's (NVML sees what the allocator keeps
    between jobs); `role` "fit" or "validation" (held-back shapes and configurations without a coefficient
    of their own). Capped jobs go to `capped` (the card checks)."""
    points, capped = [], []
    for source, report in sources:
        for c in report.get("configs", []):
            offload, tiling = CONFIG_MEMORY[c["config"]]
            seen: list[int] = []
            for j in c.get("jobs", []):
                if "skipped" in j:
                    continue
                shape = "x".join(map(str, j["shape"]))
                base = {"config": c["config"], "offload": offload, "vae_tiling": tiling, "shape": j["shape"],
                        "steps": j["steps"], "nvml_peak_mib": j["nvml_peak_mib"],
                        "measured_gib": round(j["nvml_peak_mib"] / 1024, 3), "job_s": j["wall_s"],
                        "planner_before_gib": j.get("planner_peak_gib"), "source": f"{source}#{c['config']}"}
                if j.get("cap_gib"):
                    capped.append(dict(base, cap_gib=j["cap_gib"], ran=bool(j.get("ok")), oom=bool(j.get("oom"))))
                    continue
                first = not seen
                valid = first or all(j["nvml_peak_mib"] != s for s in seen)
                why = ("first job of its server" if first else "its peak differs from every earlier job's of its server"
                       if valid else "repeats an earlier job's peak of its server (masked)")
                role = "validation" if shape in held_back or c["config"] in no_fit else "fit"
                points.append(dict(base, id=f"{c['config']}-{shape}", valid=valid, why=why, role=role))
                seen.append(j["nvml_peak_mib"])
    return {"points": points, "capped": capped}
