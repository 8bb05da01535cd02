"""Issue 25's ComfyUI part on CPU: what ComfyUI 0.3.64 itself spends around a node that returns a big IMAGE
(Generate Video's [121, 704, 1280, 3] float32, 1.3 GB) plus a VIDEO and an fps, as the websocket shows it.

bench/gpu/native.py's node time is the gap between a node's `executing` websocket event and the next node's;
bench/node_overhead.py times the node's own Python path without ComfyUI. This bench runs a real
`main.py --cpu` with a probe custom node (bench/comfyui_node_overhead_probe.py, copied into a throwaway base
under /tmp, never into the pack) that returns a preallocated IMAGE at once, wired into the bench sink
(bench/gpu/graphs.py: GetImageSize -> PreviewAny x3, ImageFromBatch -> SaveImage of 4 frames). The probe marks
(time.monotonic, the websocket reader's clock) the executor's phases, so each run splits the probe's websocket
node time into: `before_fn_s` (its `executing` sent -> its function entered: the node object, the V3 class
clone), `fn_s` (the function itself), `after_fn_s` (returned -> the next node's `executing` sent: the V3
result unpacking, the output cache, the progress registry, ExecutionList, the next node's inputs), and
`ws_delay_s` (send_sync to the websocket reader, for the probe's and the next node's `executing`).

Variants (cases): `big` (the TI2V-5B IMAGE, a 67 MB VIDEO), `big_novideo`, `big_permuted` (the same IMAGE as a
non-contiguous view), `small` (one 64x64 frame, a 1 MB VIDEO: the fixed part). With --real, our own Generate
Video node too (Remote Server typed URL -> Generate Video -> the same sink) against bench/node_overhead_server.py
serving a small noise clip, its function time taken from the executor's _async_map_node_over_list marks.

With --local, our TI2V-5B template (Local Server) on the launcher's stub server too. Each run also sums our pack's
ComfyUI calls inside the node (nodes/comfy_bridge.py: the bar, the status text, VIDEO, IMAGE, the Cancel flag)
and the node's own time before the POST (`pre_submit_s`) and after the client's job (`after_job_s`). Websocket
node times are node_times' (bench/gpu/native.py), rounded to the millisecond; the first run of a case is a
warm-up, left out of the medians.

    VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON=.venv-server/bin/python \
    /work/comfyui-venv/bin/python bench/comfyui_node_overhead.py --comfy-dir /work/comfyui-src [--runs 6] \
        [--cases big,big_novideo,big_permuted,small] [--real [--real-shape 1280x704x121 --real-clip MP4]] \
        [--local] [--out FILE]

Results: bench/results/cpu-comfyui-node-overhead.json (probe cases, our node at 320x192x17 remote and local),
bench/results/cpu-comfyui-node-overhead-fullsize-node.json (our node at 1280x704x121 on a 59 MB noise clip) and,
for that one, bench/results/cpu-comfyui-node-overhead-same-box-node-path.json (bench/node_overhead.py: the same
node path, clip and 0.5 s jobs without ComfyUI, on the same box).
"""
from __future__ import annotations

import argparse
import json
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "tests" / "comfyui")]

from comfy_harness import PACK_NAME  # noqa: E402
from comfyui_node_overhead_probe import BRIDGE  # noqa: E402
from comfyui_process import Comfy, Websocket  # noqa: E402
from gpu.graphs import sample_frames, sink  # noqa: E402
from gpu.native import node_times  # noqa: E402

PROBE = "overhead_probe"
ENTRY = """from .probe import install, node_list
from comfy_api.v0_0_2 import ComfyExtension

install()


class OverheadProbe(ComfyExtension):
    async def get_node_list(self):
        return node_list()


async def comfy_entrypoint():
    return OverheadProbe()
"""
CASES = {"big": dict(frames=121, width=1280, height=704, video_mb=67, layout="contiguous"),
         "big_novideo": dict(frames=121, width=1280, height=704, video_mb=0, layout="contiguous"),
         "big_permuted": dict(frames=121, width=1280, height=704, video_mb=67, layout="permuted"),
         "small": dict(frames=1, width=64, height=64, video_mb=1, layout="contiguous")}
REAL = dict(width=320, height=192, frames=17, fps=24)   # a TI2V-5B-valid small clip (--real-shape: another)


def probe_prompt(case: dict, seed: int) -> dict:
    prompt = {"1": {"class_type": "OverheadProbeImage", "inputs": dict(case, seed=seed)}}
    return sample_frames(sink(prompt, ["1", 0]), ["1", 0], "probe", case["frames"])


def local_prompt(seed: int) -> dict:
    """The TI2V-5B template (Load Model -> Serving Config -> Local Server -> Generate Video "5"), SaveVideo
    replaced by the sink, at REAL's size, on the launcher's stub server (tests/contract/stub_vllm_serve.py)."""
    prompt = json.loads((REPO / "workflows" / "api" / "wan22_ti2v_5b_text_to_video.api.json").read_text())
    prompt = {k: e for k, e in prompt.items() if e["class_type"] != "SaveVideo"}
    prompt["5"]["inputs"].update({k: REAL[k] for k in ("width", "height", "frames")}, steps=2, seed=seed)
    return sample_frames(sink(prompt, ["5", 0]), ["5", 0], "local", REAL["frames"])


def launcher_env(work: Path) -> dict[str, str]:
    """The launcher pointed at its stub server (tests/comfyui/run_real_comfyui.py's settings, steps of 0.05 s)."""
    sys.path.insert(0, str(REPO / "tests" / "contract"))
    import stubserver

    return {"VLLM_OMNI_LAUNCHER_SERVER_CMD": shlex.join([stubserver.server_python(), stubserver.STUB_SCRIPT]),
            "VLLM_OMNI_LAUNCHER_DATA_DIR": str(work / "launcher-data"),
            "VLLM_OMNI_LAUNCHER_GPU_LOCK_DIR": str(work / "gpu-locks"),
            "VLLM_OMNI_LAUNCHER_CONFIG": str(work / "no-launcher-config.json"),
            "VLLM_OMNI_LAUNCHER_GPU_MEMORY_GB": "24", "VLLM_OMNI_STUB_STEP_S": "0.05"}


def real_prompt(url: str, seed: int) -> dict:
    prompt = {"10": {"class_type": "VLLMOmniRemoteServer", "inputs": {"url": url, "model_family": "ti2v_5b"}},
              "1": {"class_type": "VLLMOmniGenerateVideo", "inputs": dict(
                  REAL, server=["10", 0], prompt="a fox", negative_prompt="", steps=2, guidance=-1.0,
                  guidance_2=-1.0, boundary_ratio=-1.0, flow_shift=-1.0, seed=seed)}}
    return sample_frames(sink(prompt, ["1", 0]), ["1", 0], "real", REAL["frames"])


def split(marks: list, events: list, prompt_id: str, node: str = "1") -> dict[str, Optional[float]]:
    """One run's phases around `node` from the probe's marks and the websocket's arrival times."""
    def first(tag: str, who: Any = node, after: float = 0.0) -> Optional[float]:
        return next((t for g, n, t in marks if g == tag and (who is None or str(n) == who) and t >= after), None)

    sent = first("send:executing")
    sends = [(t, str(n)) for g, n, t in marks if g == "send:executing" and n is not None]
    nxt = next(((t, n) for t, n in sends if sent is not None and t > sent), (None, None))
    arrivals = {str(e["data"].get("node")): e["t"] for e in events
                if e["type"] == "executing" and e["data"].get("prompt_id") == prompt_id}
    fn_in, fn_out = first("fn>"), first("fn<")
    call_in = first("_async_map_node_over_list>", after=sent or 0.0)
    call_out = first("_async_map_node_over_list<", after=sent or 0.0)
    if fn_in is None:                            # our real node: the executor's call marks
        fn_in, fn_out = call_in, call_out
    exec_out = first("execute<")
    got = first("get_output_from_returns<", None, after=call_out or 0.0)
    cached = first("set<", after=call_out or 0.0)
    done = first("finish_progress<", after=call_out or 0.0)
    staged = first("stage_node_execution<", None, after=exec_out or 0.0)
    inputs = first("get_input_data<", nxt[1], after=exec_out or 0.0)

    def gap(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return None if a is None or b is None else round(b - a, 4)

    bridge = {}
    for function in BRIDGE:
        enters = [t for g, _, t in marks if g == f"{function}>" and fn_in is not None and fn_in <= t <= fn_out]
        exits = [t for g, _, t in marks if g == f"{function}<" and fn_in is not None and fn_in <= t <= fn_out]
        if enters:
            bridge[function] = {"calls": len(enters), "s": round(sum(exits) - sum(enters), 4)}
    posted, job_done = first("submit>", None, after=fn_in or 0.0), first("generate<", None, after=fn_in or 0.0)
    if posted is not None:                       # our real node: its own path around the client's job
        bridge["pre_submit_s"], bridge["after_job_s"] = gap(fn_in, posted), gap(job_done, fn_out)
    ws = node_times(events, prompt_id).get(node)
    return {"ws_node_s": ws, "before_fn_s": gap(sent, fn_in), "fn_s": gap(fn_in, fn_out),
            "after_fn_s": gap(fn_out, nxt[0]), "comfy_s": None if ws is None or fn_in is None or fn_out is None
            else round(ws - (fn_out - fn_in), 4),
            "phases": {"call_return_s": gap(fn_out, call_out), "get_output_from_returns_s": gap(call_out, got),
                       "cache_set_s": gap(got, cached), "finish_progress_s": gap(cached, done),
                       "execute_exit_s": gap(done, exec_out), "stage_next_s": gap(exec_out, staged),
                       "next_inputs_s": gap(staged, inputs), "next_send_s": gap(inputs, nxt[0])},
            "ws_delay_s": {"this": gap(sent, arrivals.get(node)), "next": gap(nxt[0], arrivals.get(nxt[1] or ""))},
            "next_node": nxt[1], "bridge": bridge}


def run_one(comfy: Comfy, ws: Websocket, client_id: str, prompt: dict) -> tuple[list, str, dict]:
    start = len(ws.snapshot())
    code, body = comfy.post("/prompt", {"prompt": prompt, "client_id": client_id})
    if code != 200:
        raise RuntimeError(f"/prompt {code}: {body}")
    pid = body["prompt_id"]
    end = ws.wait_for(lambda e: e["type"] in ("execution_success", "execution_error")
                      and e["data"].get("prompt_id") == pid, 600, start)
    if end is None or end["type"] != "execution_success":
        raise RuntimeError(f"run {pid} did not succeed: {end}; log tail:\n{comfy.log()[-3000:]}")
    time.sleep(0.2)                              # the last events' arrival (the success event is the last sent)
    return json.loads(urllib.request.urlopen(comfy.url + "/overhead_probe/marks", timeout=30).read()), pid, \
        {"events": ws.snapshot()[start:]}


def stub_server(python: str, work: Path, clip: Optional[Path]) -> tuple[subprocess.Popen, str]:
    """bench/node_overhead_server.py serving `clip` (made here when None: noise at REAL's shape), jobs of 0.5 s."""
    from decode_bench import make_noise_clip

    if clip is None:
        clip = work / "clip.mp4"
        clip.write_bytes(make_noise_clip(REAL["frames"], REAL["width"], REAL["height"], REAL["fps"]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([python, str(REPO / "bench" / "node_overhead_server.py"), str(clip), str(port), "0.5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=1)
            break
        except OSError as err:
            if getattr(err, "code", None):       # an HTTP answer: it is up
                break
            time.sleep(0.1)
    return proc, url


def summary(rows: list[dict]) -> dict:
    """Medians over the runs after the first (a warm-up: imports, the first allocation)."""
    warm = rows[1:] or rows

    def med(get) -> Optional[float]:
        values = [v for v in (get(r) for r in warm) if v is not None]
        return round(statistics.median(values), 4) if values else None

    keys = ("ws_node_s", "before_fn_s", "fn_s", "after_fn_s", "comfy_s")
    out: dict[str, Any] = {k: med(lambda r, k=k: r[k]) for k in keys}
    out["phases"] = {k: med(lambda r, k=k: r["phases"][k]) for k in rows[0]["phases"]}
    out["ws_delay_s"] = {k: med(lambda r, k=k: r["ws_delay_s"][k]) for k in ("this", "next")}
    out["next_node"] = rows[-1]["next_node"]
    out["bridge"] = {k: {"calls": med(lambda r, k=k: r["bridge"].get(k, {}).get("calls")),
                         "s": med(lambda r, k=k: r["bridge"].get(k, {}).get("s"))} for k in BRIDGE}
    out["bridge"].update({k: med(lambda r, k=k: r["bridge"].get(k)) for k in ("pre_submit_s", "after_job_s")})
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--comfy-dir", default="/work/comfyui-src")
    ap.add_argument("--runs", type=int, default=5, help="runs per case (the first is a warm-up)")
    ap.add_argument("--cases", default="big,big_novideo,big_permuted,small")
    ap.add_argument("--real", action="store_true", help="also our Generate Video against a stub job server")
    ap.add_argument("--local", action="store_true", help="also our template (Local Server) on the launcher's stub "
                    "server ($VLLM_OMNI_LAUNCHER_TEST_SERVER_PYTHON)")
    ap.add_argument("--real-shape", default="320x192x17", help="WIDTHxHEIGHTxFRAMES of the stub's noise clip")
    ap.add_argument("--real-clip", help="an MP4 of --real-shape for the stub (e.g. bench/node_overhead.py's "
                    "bench/out/node-overhead/noise-1280x704x121-crf14.mp4); default: a noise clip made here")
    ap.add_argument("--serve-python", default=str(REPO / ".venv-server" / "bin" / "python"))
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "comfyui-node-overhead.json"))
    a = ap.parse_args(argv)
    REAL.update(zip(("width", "height", "frames"), map(int, a.real_shape.split("x"))))

    base = Path(tempfile.mkdtemp(prefix="comfyui-node-overhead-"))
    probe_dir = base / "custom_nodes" / PROBE
    probe_dir.mkdir(parents=True)
    shutil.copy2(REPO / "bench" / "comfyui_node_overhead_probe.py", probe_dir / "probe.py")
    (probe_dir / "__init__.py").write_text(ENTRY)
    comfy = Comfy(Path(a.comfy_dir), sys.executable, launcher_env(base) if a.local else {}, base, cpu=True,
                  extra_args=("--whitelist-custom-nodes", PACK_NAME, PROBE))
    stub = None
    report: dict[str, Any] = {"command": shlex.join([sys.executable, *sys.argv]), "machine": {
        "cpus": len(__import__("os").sched_getaffinity(0)), "platform": platform.platform(),
        "python": platform.python_version()}, "cases": {}}
    try:
        comfy.wait_ready(300)
        client_id = uuid.uuid4().hex
        ws = Websocket(comfy.url, client_id)
        plan = [(name, "1", lambda seed, c=CASES[name]: probe_prompt(c, seed)) for name in a.cases.split(",") if name]
        if a.real:
            stub, url = stub_server(a.serve_python, base, Path(a.real_clip) if a.real_clip else None)
            plan.append(("real_generate_video", "1", lambda seed: real_prompt(url, seed)))
        if a.local:
            plan.append(("local_generate_video", "5", local_prompt))
        seed = 0
        for name, node, make in plan:
            rows = []
            for _ in range(a.runs):
                seed += 1
                marks, pid, got = run_one(comfy, ws, client_id, make(seed))
                rows.append(split(marks, got["events"], pid, node))
                print(name, json.dumps(rows[-1]), flush=True)
            report["cases"][name] = {"inputs": CASES.get(name, dict(REAL, clip=a.real_clip)), "median": summary(rows), "runs": rows}
        ws.close()
    finally:
        comfy.stop()
        if stub is not None:
            stub.terminate()
            stub.wait(10)
        shutil.rmtree(base, ignore_errors=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
    for name, case in report["cases"].items():
        print(name, json.dumps(case["median"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
