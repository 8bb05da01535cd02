"""`generate`: one video through an existing server (--url) or one the supervisor starts.

The same client the nodes use: multipart submit, sub-second polling, MP4 download, with a timing
report for benchmarking the overhead. The frames are decoded into the IMAGE array only for
--frames-npy; otherwise the MP4 is written as the server sent it, once its header has been
checked against the request (frames.probe_mp4).
The result line ("wrote PATH: ...") goes to stdout; start phases and job progress to stderr.

The shortest form, `generate --prompt "..."`, needs nothing else: the model is picked for this
machine (planner/auto_model.py) and served with `--parallel auto` (the launch is resolved by
the same resolve_launch() as the Local Server node's), the seed is drawn here, and the MP4 is
written to ./vllm-omni-<YYYYmmdd-HHMMSS>-<seed>.mp4; the first stderr lines say which model
and configuration, and why.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from ..client.api import VideoClient
from ..client.media import MAX_AUDIO_S, MAX_REFERENCE_IMAGES
from ..client.request import DEFAULT_SAMPLER, SAMPLERS
from ..client.transport import Deadlines
from ..errors import LauncherError
from ..models import ALL_FAMILIES, InputWords, check_inputs, family_for, guidance_as_sent, request_for
from ..planner.launch_plan import NO_GPU, RequestLimit
from ..planner.speed_costs import cfg_runs
from ..server.config.local_config import load_local_config
from ..server.config.remote_servers import remote_target
from ..server.launch.loras import request_lora_from_cli
from ..server.launch.worker_mp4 import settle as settle_worker_mp4
from .launch_options import add_launch_options, launch_from_args
from .request_options import check_request_options

OUT_PATTERN = "vllm-omni-{time}-{seed}.mp4"     # the default --out, in the current directory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "server", "Without --url and --model, generate starts the model auto picks for this machine\n"
        "(a downloaded one that fits, else TI2V-5B, the smallest download) with --parallel auto;\n"
        "its first stderr lines say which model and configuration, and why.")
    g.add_argument("--url", default=None, metavar="URL|NAME",
                   help="use this running server (e.g. http://127.0.0.1:8091, or the name of one in the local "
                        "config's remote_servers) instead of starting one; its key comes from the local config")
    g.add_argument("--family", default=None, choices=sorted(ALL_FAMILIES),
                   help="with --url: which Wan2.2 model the server runs (default: from its model name)")
    add_launch_options(parser, model_required=False, parallel_default="auto", launching=True)
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
    r.add_argument("--control-video", default=None, metavar="MP4",
                   help="VACE: an H.264 MP4 the video follows (depth, pose, edges or a source clip), exactly "
                        "--width x --height and --frames frames")
    r.add_argument("--reference-image", action="append", default=None, metavar="PATH",
                   help="VACE: an image whose subject or style the video shows (repeat for up to "
                        f"{MAX_REFERENCE_IMAGES}; more than one needs vLLM-Omni 0.30); not with --control-video")
    r.add_argument("--audio", default=None, metavar="WAV",
                   help=f"S2V-14B: the speech or song to animate --image with (PCM WAV, at most {MAX_AUDIO_S:g} "
                        "s; the clip is as long as the audio, --frames is the length of each part)")
    r.add_argument("--seed", type=int, default=None, metavar="N",
                   help="random seed (default: a random one, printed and put in the default file name)")
    r.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=SAMPLERS,
                   help="unipc (upstream's default) or euler (4-step distill LoRAs)")
    r.add_argument("--lora-request", default=None, metavar="DIR[:STRENGTH]",
                   help="a PEFT LoRA folder applied to this request only (vLLM-Omni 0.26 and 0.30; the path as "
                        "the server sees it); single .safetensors files go to --lora")
    o = parser.add_argument_group("output")
    o.add_argument("--out", default=None, metavar="PATH",
                   help="where to write the server's MP4 (default: " + OUT_PATTERN.format(
                       time="YYYYmmdd-HHMMSS", seed="SEED") + " in the current directory); stdout names it")
    o.add_argument("--frames-npy", default=None, metavar="PATH",
                   help="also save the decoded IMAGE tensor [F,H,W,3] float32 (only then is the video decoded)")
    o.add_argument("--report-json", default=None, metavar="PATH",
                   help="write timings: submit, queued, running, job_done, detected, downloaded, decoded "
                        "(without --frames-npy no frame is decoded: 'decoded' is when the MP4's header was checked)")


def _served_family(client: VideoClient, url: str) -> Any:
    """The Wan2.2 family of the model a running server lists first."""
    served = client.models()
    if not served:
        raise LauncherError(f"The server at {url} lists no model", "its /v1/models answer is empty",
                            "check that the server finished loading, or pass --family", setting="family")
    return family_for(served[0])


def _load_image(path: Optional[str]) -> Any:
    """--image as the picture the request's PNG is made from (models.request_for, at the request's size;
    None without one)."""
    return _read_rgb(path, "--image", "the start image") if path else None


# The command line's words for the inputs models/inputs.py's rule speaks of.
CLI_WORDS = InputWords(
    names={"image": "--image", "control_video": "--control-video", "reference_images": "--reference-image",
           "audio": "--audio"},
    give={"image": "pass --image PATH (a PNG or JPEG)", "control_video": "pass --control-video MP4",
          "reference_images": "pass --reference-image PATH", "audio": "pass --audio SPEECH.wav"},
    drop="leave {name} out", use="use --model {models}", model=lambda family: family.hf_id)


def _check_inputs(args: argparse.Namespace, family: Any) -> None:
    """The inputs the options give, by the model's one rule (models.check_inputs), before any file is read."""
    given = [name for name, flag in (("image", args.image), ("control_video", args.control_video),
                                     ("reference_images", args.reference_image), ("audio", args.audio)) if flag]
    check_inputs(family, given, CLI_WORDS, references=len(args.reference_image or ()))


def _checked_image(args: argparse.Namespace, family: Any) -> Any:
    """--image as a picture, read only once `family`'s inputs rule took the options: a model that takes no
    image refuses --image in the rule's words, not with what reading the file says. A local launch calls
    this before the launch is resolved; --url without --family once the server has said its model."""
    _check_inputs(args, family)
    return _load_image(args.image)


def _media(args: argparse.Namespace) -> dict[str, Any]:
    """The VACE / S2V media of the command line, read once and bounded (client/media.py): checked before a
    local launch, sent after it. Reference images stay pictures: models.request_for makes them at the
    request's size, as it does --image."""
    from ..client.media import audio_clip_from_wav, control_video_from_mp4

    media = getattr(args, "_media", None)
    if media is not None:
        return media
    media = {}
    if args.control_video:
        media["control_video"] = control_video_from_mp4(args.control_video)
    if args.reference_image:
        media["reference_images"] = tuple(_read_rgb(path, "--reference-image") for path in args.reference_image)
    if args.audio:
        media["audio"] = audio_clip_from_wav(args.audio)
    args._media = media
    return media


def _read_rgb(path: str, flag: str, what: str = "it") -> Any:
    """The picture at `path` as [H, W, 3] uint8; a missing or unreadable file is a usage error naming `flag`."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            return np.asarray(img.convert("RGB"))
    except FileNotFoundError as exc:
        raise LauncherError(f"{flag} {path}: no such file", f"{what} must be a PNG or JPEG file",
                            f"check the path given to {flag}", setting=flag) from exc
    except (UnidentifiedImageError, OSError) as exc:
        raise LauncherError(f"{flag} {path} cannot be read as an image", str(exc),
                            f"give {flag} a PNG or JPEG file", setting=flag) from exc


def run(args: argparse.Namespace) -> int:
    check_request_options(args)            # the same rule as `plan`, before anything else
    config = load_local_config()
    deadlines = Deadlines.from_config(config)
    drawn = args.seed is None
    if drawn:
        args.seed = random.randrange(2**31)     # short to retype; any seed in models.SEED's range works
    if args.out is None:
        args.out = OUT_PATTERN.format(time=time.strftime("%Y%m%d-%H%M%S"), seed=args.seed)
    sup = client = request = None
    if args.url:
        if args.lora:
            raise LauncherError("--lora cannot change a running server",
                                "it fuses a LoRA file when a server starts, and --url uses one already running",
                                "start that server with `serve --lora FILE`, or pass a PEFT folder with "
                                "--lora-request", setting="lora")
        # A configured server's name, else a URL (checked, and given a key only for a configured origin):
        # the Remote Server node's one rule.
        _, url, key = remote_target(config, args.url, args.url if args.url in config.remote_servers else "")
        if args.family:
            family = ALL_FAMILIES[args.family]
            request = _request(args, family, _checked_image(args, family))
        client = VideoClient(url, api_key=key, deadlines=deadlines,
                             clip_memory_gib=config.max_clip_memory_gib, proxy=config.remote_proxy)
    else:
        from ..server.registry import Supervisor

        picked = "" if args.model else _pick_model(args, config)
        image = _checked_image(args, family_for(args.model))     # a missing or unreadable --image too
        if family_for(args.model).pipeline in ("vace", "s2v"):   # their media, checked before anything starts
            _request(args, family_for(args.model), image, convert_pictures=False)   # made at the plan's size below
        # Refuses at once a machine without GPUs (before the model line, which would only say that
        # nothing could be planned), and checks the server environment's pair too.
        try:
            plan = launch_from_args(args, config, cfg=_runs_cfg(args))
        except LauncherError as exc:
            if picked and exc.kind != NO_GPU:
                _say(picked)
            raise
        if picked:
            _say(picked)
        if plan.text:
            _say(f"serving: {plan.text}")
        for warning in plan.warnings:
            _say(f"warning: {warning}")
        request = _request(args, plan.spec.family, image, plan.limit)   # checked before anything starts
        sup = Supervisor(plan.spec, config, plan.fallback)
    if drawn:
        _say(f"seed: {args.seed} (random; --seed {args.seed} makes this video again)")
    try:
        if sup is not None:
            print(f"starting {sup.spec.served_name} ...", file=sys.stderr)
            sup.start(on_status=lambda st: print(f"  {st.text}", file=sys.stderr))
            client = VideoClient(sup.url, api_key=sup.api_key, served_name=sup.spec.served_name,
                                 server_version=sup.server_version, deadlines=deadlines,
                                 clip_memory_gib=config.max_clip_memory_gib, supervised=True,
                                 log_hint=f"the server log is {sup.log_path}; queue the job again",
                                 storage_dir=sup.storage_dir)
        if request is None:         # --url without --family: the server's model says which inputs it takes
            family = _served_family(client, client.base_url)
            request = _request(args, family, _checked_image(args, family))
        settle_worker_mp4(request, *((sup.spec, sup.server_version) if sup is not None else (None, None)))
        return _generate(args, client, request, sup)
    finally:                    # also on Ctrl-C: a server this command started never outlives it
        if client is not None:
            client.close()
        if sup is not None:
            sup.stop()


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _pick_model(args: argparse.Namespace, config: Any) -> str:
    """No --model and no --url: the model auto picks for this machine, and the line that says why
    (printed once the launch is resolved: a machine that cannot serve hears that first)."""
    from ..planner.auto_model import pick_model
    from ..planner.launch_plan import gpu_memory

    _, sizes, source = gpu_memory()
    pick = pick_model(config, sizes, source, start_image=bool(args.image))
    args.model = pick.model
    return f"model: {pick.model} (auto: {pick.why}; --model picks another)"


def _runs_cfg(args: argparse.Namespace) -> bool:
    """Whether the job runs CFG, from its guidance as the request will carry it (the launch is
    planned for it before the request itself can be built with the plan's size)."""
    return cfg_runs(*guidance_as_sent(family_for(args.model), args.guidance, args.guidance_2))


def _request(args: argparse.Namespace, family: Any, image: Any,
             limit: Optional[RequestLimit] = None, convert_pictures: bool = True) -> Any:
    """The request with the model's defaults filled in and checked (models.request_for, as the node does),
    with the serving plan's size and frames where the options leave them to the model; `convert_pictures`
    False: checked only, no picture converted (request_for's), for the check before a local launch."""
    shape: dict[str, Any] = {"width": args.width, "height": args.height, "frames": args.frames}
    if limit is not None:
        shape, note = limit.apply(shape)
        if note:
            _say(f"note: {note}")
    _check_inputs(args, family)
    # --boundary-ratio / --flow-shift (launch options) apply to the request too; a server-side
    # boundary ratio wins upstream anyway, and the request's flow shift beats the server's.
    request = request_for(
        family, prompt=args.prompt, negative_prompt=args.negative_prompt, fps=args.fps, steps=args.steps,
        guidance=args.guidance, guidance_2=args.guidance_2, boundary_ratio=args.boundary_ratio,
        flow_shift=args.flow_shift, seed=args.seed, image=image, convert_pictures=convert_pictures, **shape,
        **_media(args))
    lora = request_lora_from_cli(args.lora_request, family) if args.lora_request else None
    return replace(request, sampler=args.sampler, lora=lora)


def _denoised(sup: Any) -> Optional[Callable[[], int]]:
    """The fast-poll hint of a supervised server, as the node gives it (Supervisor.job_hint: its log's
    last denoise step, then the stored MP4); None for --url: the client's own record of earlier jobs."""
    return sup.job_hint()[1] if sup is not None else None


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

    # Only the MP4 asked for: no frame is decoded, the header is checked against the request. A
    # server this command started hints when its log shows the last denoise step and then the MP4
    # stored, as for the node.
    result = client.generate(request, on_update=on_update, decode=bool(args.frames_npy), due=_denoised(sup))
    Path(args.out).write_bytes(result.mp4)
    if result.video is not None:
        import numpy as np

        np.save(args.frames_npy, result.video.frames)
    info = result.info
    timings = dict(result.timings)
    timings["detected"] = timings.get("job_done")
    if args.report_json:
        Path(args.report_json).write_text(json.dumps({
            "job_id": result.job_id, "frames": info.num_frames, "width": info.width, "height": info.height,
            "fps": info.fps, "mp4_bytes": len(result.mp4), "decoded": result.video is not None,
            "timings": timings}, indent=1))
    print(f"wrote {args.out}: {info.num_frames} frames {info.width}x{info.height} at {info.fps:g} fps "
          f"in {timings['decoded']:.1f}s")
    return 0
