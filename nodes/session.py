"""What the nodes ask of the core: a server to use, jobs run on it, a report.

Each node is a declaration plus one call here, which opens the right client for a handle and runs the
work with the node's reporter (progress.py). Keys are looked up at use, from the registry (our servers)
or the local config (remote ones): never from a widget or a handle. Local servers are found by the
fingerprint of the launch spec asked for, not by process: one the supervisor restarted is used as it is
(port, key), one no longer running (keep-alive, Stop Server, crashes) is started again from the handle's
choices, its launch on the Generate node; so Local Server needs no fingerprint_inputs. Which server a
handle's jobs, reports and stops reach after a job re-planned it is the registry's answer (`registry.find`).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Callable, Optional

from ..client.api import VideoClient
from ..client.job_results import GenerationCancelled, GenerationResult
from ..client.poll_window import LEARNED, job_kind
from ..client.request import FrameInterpolation
from ..client.transport import Cancelled, Deadlines
from ..errors import LauncherError
from ..models import ALL_FAMILIES, family_for, request_for
from ..planner.doctor import run_doctor
from ..planner.launch_plan import LaunchPlan
from ..planner.queued_prompt import jobs_run_cfg, queued_jobs
from ..planner.speed_costs import cfg_runs, idle_cfg_warning
from ..server import registry
from ..server.config.config_values import shown
from ..server.config.local_config import LocalConfig, load_local_config
from ..server.config.remote_servers import remote_target
from ..server.launch.loras import LoraPlan, plan_loras
from ..server.launch.worker_mp4 import settle as settle_worker_mp4
from . import comfy_bridge, prestart_wait, progress
from .handles import ModelChoice, ServerHandle, ServingChoice
from .last_choices import record as record_choices

NO_MODEL = "(none)"                               # interpolation_model: none picked
INTERPOLATION = {"off": 0, "x2": 1, "x4": 2}      # frame_interpolation -> RIFE exp (frames and fps times 2**exp)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- local servers
def start_local(model: ModelChoice, serving: ServingChoice, node_id: Optional[str],
                prompt: Optional[dict[str, Any]] = None) -> ServerHandle:
    """Start (or reuse) the server for these choices; the plan and the launch show on the node.
    `prompt`: the queued prompt (ComfyUI's hidden PROMPT), whose job nodes say the guidance and
    how many jobs a Generate Batch submits at once (for the planner's replica advice)."""
    with progress.reporting(node_id, "Planning the launch") as reporter:
        config = load_local_config()
        cfg, jobs = jobs_run_cfg(prompt, node_id, model.family), queued_jobs(prompt, node_id)
        sup, plan, loras = launch_local(model, serving, config, reporter, cfg=cfg, queued_jobs=jobs)
        record_choices(model, serving, cfg, jobs, plan.spec.fingerprint(), config)
        status = sup.status()
        text = status.text + (f"\n{status.fallback_note}" if status.fallback_note else "")
        text += "".join(f"\n{note}" for note in loras.notes)
        report = plan.report()
        reporter.text(text + (f"\n\n{report}" if report else ""))
        return ServerHandle("local", sup.url or "", sup.spec.served_name, sup.spec.family.key,
                            server_id=plan.spec.fingerprint(), server_version=sup.server_version,
                            model=model, serving=serving, limit=plan.limit, lora=loras.per_request)


def launch_local(model: ModelChoice, serving: ServingChoice, config: LocalConfig,
            reporter: progress.NodeReporter, cfg: bool = True, queued_jobs: int = 1,
            on_plan: Optional[Callable[[LaunchPlan], None]] = None) -> tuple[Any, LaunchPlan, LoraPlan]:
    """`queued_jobs`: the most jobs one node submits at once (a batch), for the planner's replica advice;
    `on_plan`: told the final plan before the launch (the prestart's console line)."""
    plan = serving.resolve(model.model, config, queued_jobs=queued_jobs, cfg=cfg)
    # Fused LoRAs are part of the server (its spec and fingerprint); per-request ones ride on the handle.
    loras = plan_loras(model.loras, model.family, plan.server_version, config.data_dir)
    plan = replace(plan, spec=plan.spec.with_changes(lora=loras.startup))
    if on_plan is not None:
        on_plan(plan)
    report = plan.report()
    if report:
        reporter.text(report)
    if any(s.spec != plan.spec and s.spec.with_changes(lora=plan.spec.lora) == plan.spec
           for s in registry.all_servers()):
        reporter.text("Restarting: LoRA changed (fused LoRAs and their strengths are part of the server)")
    fingerprint = plan.spec.fingerprint()
    try:
        sup = registry.get_or_start(plan.spec, config, fallback=plan.fallback, on_status=reporter.launch_status,
                                    keep_alive_minutes=serving.keep_alive_minutes,
                                    should_cancel=reporter.cancel_requested,
                                    on_wait=lambda: reporter.text(prestart_wait.waiting_text(fingerprint)))
    except registry.LaunchCancelled:
        reporter.text("Cancelled while starting: the server and all its processes were stopped")
        comfy_bridge.raise_interrupted()
    finally:
        _stop_listening(reporter.launch_status)
    return sup, plan, loras


def _stop_listening(on_status: Callable[[Any], None]) -> None:
    """The launch is over (ready, failed or cancelled): its node hears no more of the server. ComfyUI's
    node ids are small integers reused by every graph, so a later keep-alive stop, crash or Stop Server
    sent to this node's id would land on whatever node has that id in the graph open by then; the next
    node that launches (or reuses) the server subscribes its own reporter."""
    for sup in registry.all_servers():
        sup.unlisten(on_status)


def _running_local(handle: ServerHandle, config: LocalConfig, reporter: progress.NodeReporter,
                   cfg: bool = True, jobs: int = 1) -> Any:
    """The live supervisor for a local handle, started again when it no longer runs, and planned
    again for jobs without CFG (`cfg` False) when `auto` had picked CFG parallel for it. `jobs`:
    how many the caller submits at once (a batch), planned for as when Local Server started it. A re-plan's
    server is recorded in the registry (`registry.replan`), so the next jobs of that (cached) handle use it
    instead of starting the first plan again."""
    sup = registry.find(handle.server_id)
    replan = sup is not None and _auto(handle) and bool(idle_cfg_warning(sup.spec, cfg))
    if sup is not None and sup.ready() and not replan:
        return sup
    if handle.model is None or handle.serving is None:
        raise LauncherError("The local server is not running", "it was stopped or died, and this handle does "
                            "not say how to start it", "connect a Local Server node and queue again",
                            setting="server")
    reporter.text("This job runs no CFG (guidance 1), so CFG parallel would leave a GPU idle: parallel_mode "
                  "auto plans again for it (a new plan restarts the server)" if replan else
                  "The local server is not running (stopped, idle or crashed): starting it again")
    sup, plan, _ = launch_local(handle.model, handle.serving, config, reporter, cfg=cfg, queued_jobs=jobs)
    registry.replan(handle.server_id, plan.spec.fingerprint())
    return sup


def _auto(handle: ServerHandle) -> bool:
    return handle.serving is not None and handle.serving.parallel_mode == "auto"


# ----------------------------------------------------------------------------- remote servers
def connect_remote(url: str, family_key: str, remote_name: str, node_id: Optional[str]) -> ServerHandle:
    """Check a remote server answers with a model, and name it (its key stays in the config)."""
    with progress.reporting(node_id, "Connecting") as reporter:
        config = load_local_config()
        name, base, key = remote_target(config, url, remote_name)
        try:
            with VideoClient(base, api_key=key, deadlines=Deadlines.from_config(config),
                             proxy=config.remote_proxy) as client:
                names = client.models(should_cancel=reporter.cancel_requested)
        except Cancelled:
            reporter.text("Cancelled while connecting to the server")
            comfy_bridge.raise_interrupted()
        if not names:
            raise LauncherError(f"The server at {base} serves no model", "/v1/models returned an empty list",
                                "check the server's log", setting="url")
        _check_served_family(base, names[0], family_key)
        reporter.text(f"Connected: {names[0]} at {base}" + (f" ({name})" if name else "")
                      + ("; API key from the local config" if key else ""))
        return ServerHandle("remote", base, names[0], family_key, remote_name=name)


def _check_served_family(base: str, served: str, family_key: str) -> None:
    """Refuse a model_family the server contradicts: its defaults (size, frames, fps, guidance, shift)
    and request rules would be another model's. A served id no family claims (a renamed model, a folder
    on the server's machine) says nothing, so the widget's family is taken as given."""
    try:
        family = family_for(served)
    except LauncherError:
        return
    if family.key == family_key:
        return
    named = ALL_FAMILIES.get(family_key) if isinstance(family_key, str) else None
    said = f"{family_key} ({named.label})" if named is not None else shown(family_key)
    raise LauncherError(
        f"The server at {base} serves {served} ({family.label}), but Remote Server's model_family says {said}",
        "each family has its own request defaults (size, frames, fps, guidance, flow shift) and request rules, "
        f"so Generate Video would build its jobs for {named.label if named else 'another model'} and send them "
        f"to a {family.label} server",
        f"set Remote Server's model_family to {family.key}", setting="model_family")


# ----------------------------------------------------------------------------- one job
def generate_video(handle: ServerHandle, *, image: Any = None, node_id: Optional[str] = None,
                   **widgets: Any) -> tuple[Any, float, Any]:
    """One job: (IMAGE frames, fps, VIDEO). Widgets are Generate Video's, 0 / -1 meaning the
    model's value (or the serving plan's, when the plan fits less than the model's default).
    The handle's per-request LoRA, the sampler and frame interpolation go with the request."""
    with progress.reporting(node_id, "Checking the request") as reporter:
        request, note = build_request(handle, image=image, **widgets)
        result = _run(handle, request, reporter)
        video, server = result.video, result.timings.get("server_inference")
        # ComfyUI's console: the job's own times (no prompt, key or URL), so its log shows our part per job
        log.info("vLLM-Omni job done: %d frames %dx%d at %g fps; %s, frames ready %.3f s after submit",
                 video.num_frames, video.width, video.height, video.fps, "the server gave no time"
                 if server is None else f"the server's own time {server:.3f} s", result.timings.get("decoded", 0.0))
        reporter.text(f"Done: {video.num_frames} frames {video.width}x{video.height} at {video.fps:g} fps "
                      f"in {result.timings.get('decoded', 0.0):.1f}s" + (f"\n{note}" if note else ""))
        return (comfy_bridge.to_image(video.frames), float(video.fps),
                comfy_bridge.make_video(result.mp4, video.fps))


def build_request(handle: ServerHandle, *, image: Any = None, sampler: Optional[str] = None,
                  frame_interpolation: str = "off", interpolation_model: str = NO_MODEL,
                  **widgets: Any) -> tuple[Any, str]:
    """Generate Video's widgets as one checked VideoRequest for this handle (the plan's limit, the
    start image, the handle's per-request LoRA, sampler, interpolation) and the note for the Done
    line. Generate Batch builds its requests from this one too."""
    interpolation = interpolation_for(frame_interpolation, interpolation_model)
    # where the widgets ask for the model's size or frames and the plan fits less, the plan's
    widgets, note = (widgets, "") if handle.limit is None else handle.limit.apply(widgets)
    picture = comfy_bridge.first_image(image) if image is not None else None   # its PNG: request_for's, at its size
    request = request_for(handle.family, image=picture, **widgets)
    if interpolation is not None and handle.kind == "remote":
        raise LauncherError(
            "Frame interpolation needs a local server", "its RIFE model path is a folder on this machine, "
            "which a remote server cannot read", "set frame_interpolation to off, or use a Local Server",
            setting="frame_interpolation")
    request = replace(request, lora=handle.lora, sampler=sampler, interpolation=interpolation)
    return request, "\n".join(n for n in (note, _idle_cfg_note(handle, request)) if n)


def interpolation_for(choice: str, model_name: str) -> Optional[FrameInterpolation]:
    """Generate's frame interpolation widgets as a request part (`choice` an INTERPOLATION key: schema.py
    refuses any other before the node runs); the RIFE folder must be a list entry."""
    exp = INTERPOLATION[choice]
    if not exp:
        return None
    path = comfy_bridge.interpolation_models().get(model_name) if isinstance(model_name, str) else None
    if path is None:
        raise LauncherError(
            f"interpolation_model got {shown(model_name)}, which is not an available frame interpolation model",
            "frame interpolation needs a RIFE folder (holding flownet.pkl) under ComfyUI/models/frame_interpolation; "
            "the launcher never lets the server download one",
            "put a RIFE folder (e.g. RIFE-4.22.lite) there, refresh the node definitions (press R) and pick it as "
            "interpolation_model, or set frame_interpolation to off", setting="interpolation_model")
    return FrameInterpolation(str(path), exp)


def _idle_cfg_note(handle: ServerHandle, request: Any) -> str:
    """At guidance 1 (distill LoRAs) there is no CFG, so a CFG-parallel server leaves a GPU idle:
    say so where the user chose CFG parallel (with `auto`, the job re-plans instead)."""
    sup = registry.find(handle.server_id) if handle.kind == "local" and not _auto(handle) else None
    return "" if sup is None else idle_cfg_warning(sup.spec, cfg_runs(request.guidance, request.guidance_2))


def job_client(handle: ServerHandle, reporter: progress.NodeReporter,
               cfg: bool = True, jobs: int = 1) -> tuple[VideoClient, Any]:
    """A client for the handle's server (a stopped local one started again, its launch on this node,
    planned for `jobs` at once with or without `cfg`) and its supervisor (None: remote). The key comes
    from the registry or the local config, never from the handle."""
    config = load_local_config()
    sup = _running_local(handle, config, reporter, cfg, jobs) if handle.kind == "local" else None
    if sup is not None:
        url, key, version = sup.url, sup.api_key, sup.server_version
    else:
        (_, url, key), version = remote_target(config, handle.url, handle.remote_name), handle.server_version
    client = VideoClient(url, api_key=key, served_name=handle.served_name, server_version=version,
                         deadlines=Deadlines.from_config(config), clip_memory_gib=config.max_clip_memory_gib,
                         proxy=config.remote_proxy, supervised=sup is not None,
                         storage_dir=sup.storage_dir if sup is not None else None)
    return client, sup


def _run(handle: ServerHandle, request: Any, reporter: progress.NodeReporter) -> GenerationResult:
    def tracker(local: Any, run_floor: int, client: VideoClient) -> progress.JobProgress:
        estimate = None if local is not None else LEARNED.get(client.base_url, job_kind(request)).run_s
        return progress.JobProgress(reporter, request.steps, local, run_floor, estimate)

    return run_jobs(handle, [request], reporter, "Submitting the job", tracker,
                    lambda client, **poll: client.generate(request, **poll), GenerationCancelled,
                    lambda cancelled, sup, run_floor: _explain_cancel(cancelled, sup, reporter, run_floor))


def run_jobs(handle: ServerHandle, requests: list[Any], reporter: progress.NodeReporter, submitting: str,
             tracker: Callable[..., Any], submit: Callable[..., Any], cancelled: type[Exception],
             explain: Callable[[Any, Any, int], None]) -> Any:
    """Both Generate nodes' job loop: `job_client`, `tracker(local_progress, run_floor, client)` for
    the bar, `submit(client, on_update=, should_cancel=, due=)`; a `cancelled` is explained and ends
    the node as interrupted. Only a supervised server gives `due` (its log's last denoise step, then
    the stored MP4); a remote job's fast polls come from the client's record of earlier jobs."""
    head = requests[0]              # the requests differ in prompt and seed only
    client, sup = job_client(handle, reporter, cfg_runs(head.guidance, head.guidance_2), len(requests))
    spec, version = (sup.spec, sup.server_version) if sup is not None else (None, None)
    for request in requests:        # the worker-side MP4 where this server can make it (worker_mp4.py)
        settle_worker_mp4(request, spec, version)
    floor, due = sup.job_hint() if sup is not None else (-1, None)   # runs up to `floor` are earlier jobs'
    bar = tracker(sup.progress if sup is not None else None, floor, client)

    def on_update(update: Any) -> None:
        if sup is not None:
            sup.mark_job_activity()
        bar.on_update(update)

    reporter.text(submitting)
    try:
        with client:
            result = submit(client, on_update=on_update, should_cancel=reporter.cancel_requested, due=due)
    except cancelled as exc:
        explain(exc, sup, floor)
        comfy_bridge.raise_interrupted()
    bar.finish()
    return result


def _explain_cancel(cancelled: GenerationCancelled, sup: Any, reporter: progress.NodeReporter,
                    run_floor: int) -> None:
    unconfirmed = "" if cancelled.deleted else " (the server did not confirm the deletion)"
    if not cancelled.job_id or cancelled.status == "queued":
        cancel_note(sup, [cancelled.job_id] if cancelled.job_id else [], [], run_floor)
        reporter.text("Cancelled before the job reached the GPU" + unconfirmed)
    elif cancelled.status == "completed":
        reporter.text("Cancelled while downloading the finished video")
    else:
        where = "" if sup is not None else " on the remote server"
        reporter.text(f"Cancelled and deleted{where}{unconfirmed}. "
                      + cancel_note(sup, [], [cancelled.job_id], run_floor))


def cancel_note(sup: Any, queued: list[str], running: list[str], run_floor: int) -> str:
    """Hand deleted jobs to a local server's cancel policy (queued ones are logged; for the denoise
    running, a batched wave counting once, it weighs draining against a restart and follows through
    in the background) and say what the GPU does now. A remote server finishes what it started."""
    if sup is not None:
        for job in queued:
            sup.cancel_job(job, queued=True)
        if running:
            return f"vLLM-Omni cannot stop a Wan denoise it has started. {sup.cancel_job(running[0], run_floor).text}"
    elif running:
        return ("A Wan denoise the remote server has started keeps its GPU busy until it ends (vLLM-Omni cannot "
                "abort it), so its next job waits for that")
    return ""


# ----------------------------------------------------------------------------- reports
def server_report(handle: Optional[ServerHandle], node_id: Optional[str]) -> tuple[str]:
    """Phase, GPUs, URL and last error of launcher-started servers (or of the one given)."""
    servers = registry.all_servers()
    if handle is not None and handle.kind == "local":
        found = registry.find(handle.server_id)
        servers = [found] if found is not None else []
    lines = []
    for sup in servers:
        st = sup.status()
        where = f"{registry.describe_gpus(sup.spec.gpus)} at {st.url or '(no port yet)'}"
        line = f"{sup.spec.served_name} on {where}: {_state(st)}"
        line += f"; log: {st.log_path}" if st.log_path else ""
        if st.last_error:
            line += f"\n  last error: {st.last_error}"
        lines.append(line)
    if handle is not None and handle.kind == "remote":
        with VideoClient(handle.url, proxy=load_local_config().remote_proxy) as client:
            answering = "answering /health" if client.health() else "NOT answering /health"
        lines.append(f"{handle.served_name} at {handle.url}: remote, {answering} (not supervised here)")
    if handle is not None and handle.kind == "local" and not servers:
        lines.append(f"{handle.served_name}: not running (Generate Video starts it again when it runs)")
    return show("\n".join(lines) or "No launcher-started server is running.", node_id)


def _state(status: Any) -> str:
    """The phase part of a report line, which already names the model, GPUs and URL. A ready server's
    text restates them for the launching node ("Ready: <model> at <url> (GPUs ...)", "Ready at <url>"),
    so only its note is kept (a head's replica port, a cancelled job's or an out-of-memory job's news:
    `Status.note`, whole, whatever it holds) and the restarts it had; other phases' texts are the news
    itself (progress, restart, failure)."""
    if not status.ready:
        return status.text
    restarted = ""
    if status.restarts and status.restart_reason:
        restarted = f" (restarted {status.restarts}x, the last time because: {status.restart_reason})"
    return status.noted(f"Ready{restarted}")


def stop_servers(handle: Optional[ServerHandle], stop_all: bool, node_id: Optional[str]) -> tuple[str]:
    """Stop launcher-started servers: the one given, or all (never a process we did not start)."""
    if handle is not None and handle.kind == "remote" and not stop_all:
        report = f"{handle.url} is a remote server; the launcher only stops servers it started."
    elif stop_all or handle is None:
        count = len(registry.all_servers())
        registry.stop_all()
        report = f"Stopped {count} server(s)." if count else "No launcher-started server was running."
    else:
        stopped = registry.stop(handle.server_id)
        report = f"Stopped the server for {handle.served_name}." if stopped else \
            f"No running server for {handle.served_name}."
    return show(report, node_id)


def doctor_report(model: Optional[ModelChoice], node_id: Optional[str]) -> tuple[str]:
    """The doctor's checks for this machine (and model), each problem with its fix."""
    with progress.reporting(node_id, "Checking GPUs, the server environment, disk and ports"):
        report = run_doctor(model.model if model is not None else None, config=load_local_config(),
                            lora_roots=comfy_bridge.lora_folders(), model_roots=comfy_bridge.diffusers_folders())
    return show(report.text(), node_id)


def show(text: str, node_id: Optional[str]) -> tuple[str]:
    """A report node's result: the text under the node (the front end's progress-text widget) and
    as its STRING output (wire it to Preview Any; the node also puts it in the prompt's history)."""
    progress.NodeReporter(node_id).text(text)
    return (text,)
