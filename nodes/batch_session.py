"""What Generate Batch asks of the core: several clips from one set of widgets, in one go.

One request per prompt line x seed (session.build_request's), differing only in what vLLM-Omni 0.30's
request batching may put in one forward, all submitted at once (client/batch.py): the server batches,
spreads over replicas or queues them without a gap. The local config's `max_batch_clips` caps them
(every clip stays in memory until the node returns), and its `max_clip_memory_gib` the one IMAGE array of
all their frames (client/clip_memory.py), both before a stopped local server is started or a job is sent.
One bar covers all clips; Cancel deletes every job.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from ..client.batch import BatchCancelled, BatchResult, BatchUpdate, run_batch
from ..client.clip_memory import check_batch_memory
from ..errors import LauncherError
from ..errors.config_names import CONFIG_FILE_NAME
from ..models import SEED
from ..planner.queued_prompt import prompt_lines
from ..server.config.local_config import load_local_config
from . import comfy_bridge, progress, session
from .handles import ServerHandle

SEED_LIMIT = SEED.high + 1   # past the seed widget's range: seeds wrap around inside it


def clip_plan(prompts: str, seed: int, batch_count: int, limit: int) -> list[tuple[str, int]]:
    """(prompt, seed) per clip: every prompt line with seeds seed .. seed + batch_count - 1 (widgets
    checked by schema.py). Refuses no prompt, and more clips than the local config allows, counted
    before the list is built (10^6 prompt lines x 64 must not become 64 million clips)."""
    lines = prompt_lines(prompts)
    if not lines:
        raise LauncherError("No prompt", "prompts is empty or holds only blank lines",
                            "write one prompt per line", setting="prompts")
    count = max(1, batch_count)
    total = len(lines) * count
    if total > limit:
        raise LauncherError(
            f"The batch asks for {total} clips ({len(lines)} prompt(s) x batch_count {count}); this "
            f"machine allows {limit}",
            "every decoded clip is held in memory until the node returns, so the machine's operator caps "
            "the batch size in the launcher's local config (max_batch_clips)",
            f"use fewer prompt lines or a smaller batch_count (at most {limit} clips), or raise max_batch_clips "
            f"in {CONFIG_FILE_NAME}", setting="batch_count")
    return [(line, (seed + j) % SEED_LIMIT) for line in lines for j in range(count)]


def generate_batch(handle: ServerHandle, *, prompts: str, seed: int, batch_count: int, image: Any = None,
                   node_id: Optional[str] = None, **widgets: Any) -> tuple[Any, float, list[Any], str]:
    """(IMAGE of all clips' frames in order, fps, one VIDEO per clip, summary text)."""
    with progress.reporting(node_id, "Checking the requests") as reporter:
        config = load_local_config()
        clips = clip_plan(prompts, seed, batch_count, config.max_batch_clips)
        first, note = session.build_request(handle, image=image, prompt=clips[0][0], seed=clips[0][1], **widgets)
        requests = [replace(first, prompt=text, seed=clip_seed) for text, clip_seed in clips]
        # each clip and their sum: run_batch checks again with its client, this is before a server is started
        check_batch_memory([request.bounds() for request in requests], config.max_clip_memory_gib)
        result = _run(handle, requests, reporter)
        summary = _summary(result, clips, note)
        reporter.text(summary)
        head = result.clips[0]
        videos = [comfy_bridge.make_video(c.mp4, c.fps) for c in result.clips]
        return comfy_bridge.to_image(result.frames), float(head.fps), videos, summary


def _run(handle: ServerHandle, requests: list[Any], reporter: progress.NodeReporter) -> BatchResult:
    # a stopped local server is started again planned for this batch, as Local Server plans it
    return session.run_jobs(
        handle, requests, reporter, f"Submitting {len(requests)} jobs",
        lambda local, run_floor, _: BatchProgress(reporter, len(requests), int(requests[0].steps or 1), local,
                                                  run_floor),
        lambda client, **poll: run_batch(client, requests, **poll), BatchCancelled,
        lambda cancelled, sup, run_floor: reporter.text(_cancel_text(cancelled, sup, run_floor)))


def _cancel_text(cancelled: BatchCancelled, sup: Any, run_floor: int) -> str:
    """Hand the deleted jobs to the supervisor's cancel policy (local) and say what happened."""
    queued = [job for job, status in cancelled.jobs if status != "in_progress"]
    running = [job for job, status in cancelled.jobs if status == "in_progress"]
    unconfirmed = "" if cancelled.deleted else " (the server did not confirm every deletion)"
    note = session.cancel_note(sup, queued, running, run_floor)
    return (f"Cancelled after {cancelled.clips_done} clip(s): deleted {len(cancelled.jobs)} job(s){unconfirmed}; "
            f"{len(queued)} never reached the GPU" + (f". {note}" if note else ""))


def _summary(result: BatchResult, clips: list[tuple[str, int]], note: str) -> str:
    """The Done text. It says what the polls saw and no more: a job stays in_progress through its VAE decode
    and MP4 encode, which run beside the next job's denoise on any server, so jobs seen in progress together
    are not proof that two were denoised at once (request batching or replicas)."""
    head = result.clips[0]
    together = (f"up to {result.most_at_once} jobs were in progress on the server at once (one clip's VAE decode "
                "and MP4 encode beside the next clip's denoise counts, so this alone does not mean the server "
                "batched them or ran replicas)"
                if result.most_at_once > 1 else "the server ran them one after another")
    lines = [f"Done: {len(result.clips)} clips of {head.num_frames} frames {head.width}x{head.height} at "
             f"{head.fps:g} fps in {result.elapsed_s:.1f}s; {together}"]
    lines += [f"clip {i + 1}: seed {clip_seed}, {text[:80]}" for i, (text, clip_seed) in enumerate(clips)]
    return "\n".join(lines + ([note] if note else []))


@dataclass
class BatchProgress:
    """One bar over the denoise steps of all clips, and "clip k/n" in the text. Local: finished clips
    count all their steps, in-progress ones the step the log shows. Remote: clip by clip (the HTTP API
    has no steps). Several clips in progress at once are called just that, never said to run together:
    one clip's VAE decode and MP4 encode beside the next clip's denoise looks the same to the polls
    as a batched wave (see _summary)."""

    reporter: progress.NodeReporter
    clips: int
    steps: int
    local_progress: Optional[Any] = None         # Supervisor.progress
    run_floor: int = -1                          # denoise runs up to this id belong to earlier jobs

    def on_update(self, update: BatchUpdate) -> None:
        done, running, total = update.done, update.running, self.clips
        step = self._step() if running else 0
        self.reporter.bar(min(done * self.steps + running * step, total * self.steps), total * self.steps)
        k = min(done + 1, total)
        elapsed = progress.clock(update.elapsed_s)
        if done == total:
            self.reporter.text(f"All {total} clips done in {elapsed}")
        elif running > 1:
            last = min(k + running - 1, total)
            self.reporter.text(f"Clips {k}-{last}/{total} in progress on the server" + self._step_text(step)
                               + f", {elapsed}")
        elif running:
            self.reporter.text(f"Clip {k}/{total}" + self._step_text(step) + f", {elapsed} elapsed")
        else:
            self.reporter.text(f"Clip {k}/{total} queued, {elapsed} elapsed ({done} done)")

    def _step(self) -> int:
        current = self.local_progress() if self.local_progress is not None else None
        if current is None or current.run_id <= self.run_floor or not current.total or current.done:
            return 0
        return min(int(current.step), self.steps)

    def _step_text(self, step: int) -> str:
        return f": step {step}/{self.steps}" if self.local_progress is not None and step else ": running"

    def finish(self) -> None:
        self.reporter.bar(self.clips * self.steps, self.clips * self.steps)
