"""`generate`: one video through an existing server (--url) or one the supervisor starts.

The same client the nodes use: multipart submit, sub-second polling, MP4 download and the
decode into the IMAGE array, with a timing report for benchmarking the overhead.
The result line ("wrote clip.mp4: ...") goes to stdout; start phases and job progress to stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..client.api import VideoClient
from ..client.frames import image_to_png
from ..client.transport import Deadlines
from ..errors import LauncherError
from ..models import FAMILIES, family_for, request_for
from ..server.local_config import load_local_config
from ..server.versions import checked_server_version
from .launch_options import add_launch_options, spec_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--url", default=None, metavar="URL|NAME",
                   help="use this running server (e.g. http://127.0.0.1:8091, or the name of one in the local "
                        "config's remote_servers) instead of starting one; its key comes from the local config")
    g.add_argument("--family", default=None, choices=sorted(FAMILIES),
                   help="with --url: which Wan2.2 model the server runs (default: from its model name)")
    add_launch_options(parser, model_required=False)
    r = parser.add_argument_group("video")
    r.add_argument("--prompt", required=True, metavar="TEXT", help="what the video shows")
    r.add_argument("--negative-prompt", default="", metavar="TEXT", help="what to steer away from (default: none)")
    r.add_argument("--image", default=None, metavar="PATH",
                   help="start image for I2V-A14B (required) / TI2V-5B (optional), PNG or JPEG")
    for name, typ, what in (("width", int, "frame width"), ("height", int, "frame height"),
                            ("frames", int, "frame count, 4k+1"), ("fps", float, "frames per second"),
                            ("steps", int, "denoise steps"), ("guidance", float, "guidance scale"),
                            ("guidance-2", float, "A14B: guidance scale of the low-noise expert")):
        r.add_argument(f"--{name}", type=typ, default=None, metavar="N" if typ is int else "X",
                       help=f"{what} (default: the model's recommended value)")
    r.add_argument("--seed", type=int, default=None, metavar="N", help="random seed (default: random)")
    o = parser.add_argument_group("output")
    o.add_argument("--out", default="clip.mp4", metavar="PATH",
                   help="where to write the server's MP4 (default: clip.mp4)")
    o.add_argument("--frames-npy", default=None, metavar="PATH",
                   help="also save the decoded IMAGE tensor [F,H,W,3] float32")
    o.add_argument("--report-json", default=None, metavar="PATH",
                   help="write timings: submit, queued, running, job_done, detected, downloaded, decoded")


def _served_family(client: VideoClient, url: str) -> Any:
    """The Wan2.2 family of the model a running server lists first."""
    served = client.models()
    if not served:
        raise LauncherError(f"The server at {url} lists no model", "its /v1/models answer is empty",
                            "check that the server finished loading, or pass --family", setting="family")
    return family_for(served[0])


def _load_image(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        return image_to_png(np.asarray(img.convert("RGB")))


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    deadlines = Deadlines.from_config(config)
    if not args.url and not args.model:
        raise LauncherError("No server given", "generate needs a running server or a model to start",
                            "pass --url http://HOST:PORT, or --model with the launch options", setting="url")
    sup = client = request = None
    if args.url:
        named = config.remote_server(args.url)
        url = (named.url if named else args.url).rstrip("/").removesuffix("/v1")
        if args.family:
            request = _request(args, FAMILIES[args.family])
        client = VideoClient(url, api_key=config.api_key_for(url), deadlines=deadlines)
    else:
        from ..server.registry import Supervisor

        spec = spec_from_args(args, default_host=config.host)
        spec.validate(version=checked_server_version(config))
        request = _request(args, spec.family)          # checked before anything starts
        sup = Supervisor(spec, config)
    try:
        if sup is not None:
            print(f"starting {sup.spec.served_name} ...", file=sys.stderr)
            sup.start(on_status=lambda st: print(f"  {st.text}", file=sys.stderr))
            client = VideoClient(sup.url, api_key=sup.api_key, served_name=sup.spec.served_name,
                                 server_version=sup.server_version, deadlines=deadlines,
                                 log_hint=f"the server log is {sup.log_path}; queue the job again")
        if request is None:
            request = _request(args, _served_family(client, client.base_url))
        return _generate(args, client, request, sup)
    finally:                    # also on Ctrl-C: a server this command started never outlives it
        if client is not None:
            client.close()
        if sup is not None:
            sup.stop()


def _request(args: argparse.Namespace, family: Any) -> Any:
    """The request with the model's defaults filled in and checked (models.request_for, as the node does)."""
    # --boundary-ratio / --flow-shift (launch options) apply to the request too; a server-side
    # boundary ratio wins upstream anyway, and the request's flow shift beats the server's.
    return request_for(
        family, prompt=args.prompt, negative_prompt=args.negative_prompt, width=args.width, height=args.height,
        frames=args.frames, fps=args.fps, steps=args.steps, guidance=args.guidance, guidance_2=args.guidance_2,
        boundary_ratio=args.boundary_ratio, flow_shift=args.flow_shift, seed=args.seed,
        image_png=_load_image(args.image))


def _generate(args: argparse.Namespace, client: VideoClient, request: Any, sup: Any) -> int:
    last = [0.0]

    def on_update(update: Any) -> None:
        now = time.monotonic()
        if now - last[0] < 1.0:
            return
        last[0] = now
        progress = sup.progress() if sup is not None else None
        step = f" step {progress.step}/{progress.total}" if progress is not None and update.status == "in_progress" \
            else ""
        print(f"  {update.status}{step} (queued {update.queued_s:.0f}s, running {update.running_s:.0f}s)",
              file=sys.stderr)

    result = client.generate(request, on_update=on_update)
    Path(args.out).write_bytes(result.mp4)
    video = result.video
    if args.frames_npy:
        import numpy as np

        np.save(args.frames_npy, video.frames)
    timings = dict(result.timings)
    timings["detected"] = timings.get("job_done")
    if args.report_json:
        Path(args.report_json).write_text(json.dumps({
            "job_id": result.job_id, "frames": video.num_frames, "width": video.width, "height": video.height,
            "fps": video.fps, "mp4_bytes": len(result.mp4), "timings": timings}, indent=1))
    print(f"wrote {args.out}: {video.num_frames} frames {video.width}x{video.height} at {video.fps:g} fps "
          f"in {timings['decoded']:.1f}s")
    return 0
