"""One job through our VideoClient, as the Generate Video node runs it, with the split of its wall time
that bench/overhead_bench.py reports (submit, noticing completion, download, decode against the server's
own inference_time_s), under a poll mode; and the server it goes to (`Target`: one our Supervisor
launches, or a running one at a URL).
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from typing import Any, Callable, Optional

from decode_levers import patched


def say(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        w, h, f = (int(x) for x in item.lower().split("x"))
        shapes.append((w, h, f))
    return shapes



# ----------------------------------------------------------------------------- the server
class Target:
    """Where jobs go: url, key, server version, and (for a supervised server) its progress."""

    def __init__(self, url: str, api_key: Optional[str], version: tuple[int, int], served: Optional[str],
                 progress: Optional[Callable[[], Any]] = None, stop: Optional[Callable[[], None]] = None,
                 info: Optional[dict[str, Any]] = None) -> None:
        self.url, self.api_key, self.version, self.served = url, api_key, version, served
        self.progress, self.stop, self.info = progress, stop, info or {}


def supervised(model: str, server_cmd: list[str], extra_env: dict[str, str], gpus: tuple[int, ...]) -> Target:
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec, RuntimeConfig
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor

    spec = LaunchSpec(model, gpus=gpus, runtime=RuntimeConfig(enforce_eager=True))
    spec.validate()
    data_dir = tempfile.mkdtemp(prefix="vllm-omni-overhead-")
    config = LocalConfig(server_command=tuple(server_cmd), data_dir=data_dir, extra_env=extra_env,
                         startup_timeout_s=900)
    sup = Supervisor(spec, config)
    t0 = time.monotonic()
    say(f"starting {model} with our supervisor ({' '.join(server_cmd[:2])} ...)")
    sup.start(on_status=lambda st: say(f"  [{st.phase}] {st.text}"))
    ready_s = round(time.monotonic() - t0, 2)
    return Target(sup.url or "", sup.api_key, sup.server_version, spec.served_name, sup.progress, sup.stop,
                  {"mode": "supervised", "model": model, "ready_s": ready_s, "flags": spec.flags(),
                   "server_version": ".".join(map(str, sup.server_version))})


def remote(url: str, api_key_env: Optional[str]) -> Target:
    from vllm_omni_launcher.client.api import VideoClient

    key = os.environ.get(api_key_env) if api_key_env else None
    with VideoClient(url, api_key=key) as client:
        names = client.models()
    return Target(url.rstrip("/"), key, (0, 30), names[0] if names else None, info={"mode": "url", "url": url})


# ----------------------------------------------------------------------------- one job
def run_job(target: Target, shape: tuple[int, int, int], steps: int, fps: float, seed: int, mode: str,
            estimates: dict[tuple[int, int, int], float], keep_job: bool = False) -> tuple[dict[str, Any], bytes, Any]:
    from vllm_omni_launcher.client import poll_window as client_api     # the fast-poll window's module
    from vllm_omni_launcher.client.api import VideoClient, VideoRequest

    width, height, frames = shape
    req = VideoRequest("a red fox running through snow", width=width, height=height, num_frames=frames,
                       fps=fps, steps=steps, seed=seed)
    due: Optional[Callable[[], Any]] = None
    running = {"s": 0.0}
    rule, _, fast = mode.partition("@")        # "due@0.02": the due rule with 0.02 s fast polls
    if rule == "due" and target.progress is not None:
        from vllm_omni_launcher.server.logs.logwatch import fast_poll_hint

        due = fast_poll_hint(target.progress)[1]
    elif rule == "due" and shape in estimates:
        due = lambda: running["s"] >= 0.9 * estimates[shape]  # noqa: E731  (90 % of an earlier job's time)

    def on_update(update: Any) -> None:
        running["s"] = update.running_s

    if rule == "fixed":
        client_api.LEARNED.clear()     # really a poll every 0.25 s: no window from earlier jobs' times
    with VideoClient(target.url, api_key=target.api_key, served_name=target.served,
                     server_version=target.version) as client, \
            patched(client_api, "FAST_POLL_S", float(fast) if fast else client_api.FAST_POLL_S):
        result = client.generate(req, on_update=on_update, due=due, keep_job=keep_job)
    t = result.timings
    video = result.video
    inference = t.get("server_inference")
    row = {
        "shape": f"{width}x{height}x{frames}", "job_id": result.job_id, "steps": steps, "poll_mode": mode, "due_rule_used": due is not None,
        "wall_s": round(t["decoded"], 4), "inference_time_s": None if inference is None else round(inference, 4),
        "overhead_s": None if inference is None else round(t["decoded"] - inference, 4),
        "submit_s": round(t["submit"], 4),
        "detect_s": None if inference is None else round(t["job_done"] - t["submit"] - inference, 4),
        "download_s": round(t["downloaded"] - t["job_done"], 4),
        "decode_s": round(t["decoded"] - t["downloaded"], 4),
        "read_wait_s": round(t.get("read_wait", 0.0), 4), "fast_poll_s": float(fast) if fast else client_api.FAST_POLL_S,
        "queued_s": round(t.get("queued", 0.0), 4), "running_s": round(t.get("running", 0.0), 4),
        "mp4_bytes": len(result.mp4), "mp4_sha256": hashlib.sha256(result.mp4).hexdigest()[:16],
        "frames_shape": list(video.frames.shape), "dtype": str(video.frames.dtype), "fps": video.fps,
        "value_range": [round(float(video.frames.min()), 4), round(float(video.frames.max()), 4)],
    }
    estimates[shape] = t.get("running", 0.0)
    return row, result.mp4, req

