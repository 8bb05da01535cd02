"""`generate`: one video through an existing server (--url) or one the supervisor starts.

The same client the nodes use: multipart submit, sub-second polling, MP4 download and the
decode into the IMAGE array, with a timing report for benchmarking the overhead.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..client.api import VideoClient, VideoRequest
from ..client.frames import image_to_png
from ..errors import LauncherError
from ..models import FAMILIES, check_request, family_for
from ..server.local_config import load_local_config
from .launch_options import add_launch_options, spec_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--url", default=None, help="use this running server (e.g. http://127.0.0.1:8091) "
                                               "instead of starting one; key from local config")
    g.add_argument("--family", default=None, choices=sorted(FAMILIES),
                   help="with --url: which Wan2.2 model the server runs (default: from its model name)")
    add_launch_options(parser, model_required=False)
    r = parser.add_argument_group("video")
    r.add_argument("--prompt", required=True)
    r.add_argument("--negative-prompt", default="")
    r.add_argument("--image", default=None, help="start image for I2V-A14B / TI2V-5B (PNG/JPEG)")
    for name, typ in (("width", int), ("height", int), ("frames", int), ("fps", float), ("steps", int),
                      ("guidance", float), ("guidance-2", float), ("seed", int)):
        r.add_argument(f"--{name}", type=typ, default=None, help="default: the model's recommended value"
                       if name != "seed" else "default: random")
    o = parser.add_argument_group("output")
    o.add_argument("--out", default="clip.mp4", help="where to write the server's MP4")
    o.add_argument("--frames-npy", default=None, help="also save the decoded IMAGE tensor [F,H,W,3] float32")
    o.add_argument("--report-json", default=None, help="timings: submit, queued, running, job_done, "
                                                       "detected, downloaded, decoded")


def _load_image(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        return image_to_png(np.asarray(img.convert("RGB")))


def run(args: argparse.Namespace) -> int:
    config = load_local_config()
    sup = None
    if args.url:
        url = args.url.rstrip("/").removesuffix("/v1")
        client = VideoClient(url, api_key=config.api_key_for(url))
        family = FAMILIES[args.family] if args.family else family_for(client.models()[0])
    elif args.model:
        from ..server.supervisor import Supervisor

        spec = spec_from_args(args, default_host=config.host)
        spec.validate()
        sup = Supervisor(spec, config)
        print(f"starting {spec.served_name} ...", file=sys.stderr)
        sup.start(on_status=lambda st: print(f"  {st.text}", file=sys.stderr))
        family = spec.family
        client = VideoClient(sup.url, api_key=sup.api_key, served_name=spec.served_name,
                             server_version=sup.server_version)
    else:
        raise LauncherError("No server given", "generate needs a running server or a model to start",
                            "pass --url http://HOST:PORT, or --model with the launch options", setting="url")
    try:
        return _generate(args, client, family, sup)
    finally:
        client.close()
        if sup is not None:
            sup.stop()


def _generate(args: argparse.Namespace, client: VideoClient, family: Any, sup: Any) -> int:
    image = _load_image(args.image)
    width, height = args.width or family.width, args.height or family.height
    frames = args.frames or family.frames
    check_request(family, width=width, height=height, frames=frames, has_image=image is not None)
    two = family.experts == 2
    request = VideoRequest(
        prompt=args.prompt, negative_prompt=args.negative_prompt or None, width=width, height=height,
        num_frames=frames, fps=args.fps or family.fps, steps=args.steps or family.steps,
        guidance=args.guidance if args.guidance is not None else family.guidance,
        guidance_2=(args.guidance_2 if args.guidance_2 is not None else family.guidance_2) if two else None,
        # --boundary-ratio / --flow-shift (launch options) apply to the request too; a server-side
        # boundary ratio wins upstream anyway, and the request's flow shift beats the server's.
        boundary_ratio=(args.boundary_ratio if args.boundary_ratio is not None else family.boundary_ratio)
        if two else None,
        flow_shift=args.flow_shift if args.flow_shift is not None else family.flow_shift,
        seed=args.seed, image_png=image)

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
