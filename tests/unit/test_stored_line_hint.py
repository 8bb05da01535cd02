"""The server's line that it stored a job's MP4 ("Video request ID persisted KEY output file.", logged just
before the job's status turns completed, vLLM-Omni 0.26 and 0.30) is the latest fast-poll hint: the first job
of a kind on a supervised server is seen within one fast poll of it, instead of at the next normal poll once
the window the last denoise step opened has closed (the server decodes and encodes for seconds after it).

The log is the server's untrusted text: the line counts once per finished denoise run, and one job's windows
are capped, so a server that prints it again and again, or never completes the job, costs a bounded number
of fast polls. A remote server (no log, no hint) is polled as before. Fake clock: tests/helpers/clocked_jobs.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from clocked_jobs import NORMAL_S, REQUEST, FakeTime, clocked, polls_between  # noqa: F401 (clocked: a fixture)
from vllm_omni_launcher.cli import generate_cmd
from vllm_omni_launcher.client.poll_window import (FAST_POLL_S, FAST_WINDOW_S, WINDOWS_PER_JOB, Hint,
                                                   PollCadence)
from vllm_omni_launcher.server.logs.log_follower import Splitter
from vllm_omni_launcher.server.logs.logwatch import DenoiseProgress, ProgressTracker, fast_poll_hint

PER_WINDOW = FAST_WINDOW_S / FAST_POLL_S
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
# As vLLM-Omni 0.30 printed it on an H200 (1280x704x121), escapes and process tag included.
STORED_0_30 = ("\x1b[0;36m(DiffusionWorker pid=2156)\x1b[0;0m INFO 12-02 18:10:34 [helpers.py:432] Video request "
               "video_gen_bd8d4a83cc0e4077850b29720cdb8a5f persisted video_gen_bd8d4a83cc0e4077850b29720cdb8a5f "
               "output file.")
BAR_DONE = "100%|██████████| 4/4 [00:07<00:00,  1.76s/it]"


def job_hint(start: float, denoised_s: float, stored_s: Optional[float]):
    """The hint a supervised server's log gives a job started at `start`: its last denoise step at
    `denoised_s`, its MP4 stored at `stored_s` (None: never)."""
    def due(time: FakeTime) -> Hint:
        t = time.clock() - start
        if stored_s is not None and t >= stored_s:
            return Hint.STORED
        return Hint.DENOISED if t >= denoised_s else Hint.NONE
    return due


def ready_tracker(now: list[float]) -> ProgressTracker:
    tracker = ProgressTracker(clock=lambda: now[0])
    tracker.mark_server_up()
    return tracker


# ---- the parser ------------------------------------------------------------------------------------
def test_the_stored_line_marks_the_finished_run_once_in_0_30_and_0_26_logs() -> None:
    for stored_line in (STORED_0_30, _real_0_26_stored_line()):
        tracker = ready_tracker([0.0])
        assert tracker.feed("  0%|          | 0/4 [00:00<?, ?it/s]")
        assert tracker.feed(BAR_DONE)
        assert tracker.current().hint_after(0) == Hint.DENOISED
        assert tracker.feed(stored_line)                               # progress: the job completes next
        assert tracker.current().stored and tracker.current().hint_after(0) == Hint.STORED
        assert not tracker.feed(stored_line)                           # repeated: nothing changes
        assert tracker.current().hint_after(1) == Hint.NONE            # run 1 belongs to an earlier job


def _real_0_26_stored_line() -> str:
    (line,) = [s for s, _ in Splitter().feed((LOGS / "vllm-omni-0.26-serve-ti2v-tiny-1gpu.log").read_bytes(),
                                             final=True) if " persisted " in s]
    return line


def test_a_stored_line_before_the_last_step_or_glued_after_a_new_runs_first_redraw_is_not_this_runs() -> None:
    tracker = ready_tracker([0.0])
    tracker.feed("  0%|          | 0/4 [00:00<?, ?it/s]")
    tracker.feed(" 50%|█████     | 2/4 [00:03<00:03,  1.76s/it]")
    assert not tracker.feed(STORED_0_30)                               # another job's MP4, mid-denoise
    tracker.feed(BAR_DONE)
    assert tracker.current().hint_after(0) == Hint.DENOISED
    tracker.feed(STORED_0_30)
    assert tracker.feed("  0%|          | 0/4 [00:00<?, ?it/s]" + STORED_0_30)   # the next run starts
    run = tracker.current()
    assert run.run_id == 2 and not run.stored and run.hint_after(1) == Hint.NONE


def test_a_real_0_26_log_ends_its_job_run_stored() -> None:
    tracker = ProgressTracker()
    for segment, _ in Splitter().feed((LOGS / "vllm-omni-0.26-serve-ti2v-tiny-1gpu.log").read_bytes(), final=True):
        tracker.feed(segment)
    last = tracker.current()
    assert last.run_id == 1 and last.done and last.stored and last.hint_after(0) == Hint.STORED


# ---- the first job of a kind ----------------------------------------------------------------------
def test_the_first_job_of_a_kind_is_seen_within_a_fast_poll_of_the_stored_line(clocked) -> None:
    """12 s job, last denoise step at 5 s: the window that opens there closes at 6.5 s, and the job ends at 12 s.
    The stored line comes just before the end, or (the log follower's lag) just after it."""
    for stored_s in (11.99, 12.04):
        server, client = clocked([12.0])
        time = server.time
        hint = job_hint(time.clock(), 5.0, stored_s)
        result = client.generate(REQUEST, due=lambda: hint(time))
        (job,) = server.jobs
        assert job.seen_done_at - max(job.end, job.start + stored_s) <= FAST_POLL_S + 1e-6, stored_s
        assert polls_between(job, 5.0 + FAST_WINDOW_S + 0.01, 11.9) <= (11.9 - 6.5) / NORMAL_S + 2
        if stored_s < 12.0:                     # after the end, a normal poll may see the job done first
            assert 0 <= result.timings["stored_hint"] <= FAST_POLL_S + 1e-6


def test_without_the_stored_line_the_first_job_waits_for_the_normal_poll(clocked) -> None:
    """The same job with only the denoise hint (a server whose log lacks the line): seen at the next 0.25 s poll."""
    server, client = clocked([12.0])
    time = server.time
    hint = job_hint(time.clock(), 5.0, None)
    result = client.generate(REQUEST, due=lambda: hint(time))
    (job,) = server.jobs
    assert FAST_POLL_S < job.seen_done_at - job.end <= NORMAL_S + 1e-6
    assert "stored_hint" not in result.timings


def test_a_jobs_hint_counts_only_runs_newer_than_its_submission_and_the_cli_takes_it_from_its_server() -> None:
    # logwatch.fast_poll_hint is the one source of `due` (Supervisor.job_hint, used by the nodes and the CLI)
    now: list[Optional[DenoiseProgress]] = [DenoiseProgress(3, 4, 4, 1.0, 0.0, 0.0, 0.0, done=True, stored=True)]
    floor, due = fast_poll_hint(lambda: now[0])
    assert floor == 3 and due() == Hint.NONE                            # run 3 is an earlier job's
    now[0] = DenoiseProgress(4, 4, 4, 1.0, 0.0, 0.0, 0.0, done=True)
    assert due() == Hint.DENOISED
    now[0] = DenoiseProgress(4, 4, 4, 1.0, 0.0, 0.0, 0.0, done=True, stored=True)
    assert due() == Hint.STORED

    class Sup:                                                          # Supervisor.job_hint's interface
        def job_hint(self) -> tuple[int, Callable[[], int]]:
            return floor, due

    assert generate_cmd._denoised(Sup()) is due and generate_cmd._denoised(None) is None


# ---- bounded whatever the log says ----------------------------------------------------------------
def test_a_stored_line_printed_again_and_again_for_a_job_that_never_completes_costs_two_windows() -> None:
    """The hint read through the real parser: one run to its last step, then the stored line every 0.1 s for
    a minute, and the job never completes: the denoise window and the stored window, nothing more."""
    time, now = FakeTime(), [0.0]
    tracker = ready_tracker(now)
    printed = [0.0]

    def due() -> Hint:
        now[0] = time.clock()
        while printed[0] <= now[0]:                                    # what the log holds by now
            t = printed[0]
            tracker.feed("  0%|          | 0/4 [00:00<?, ?it/s]" if t == 0 else
                         BAR_DONE if t < 2.0 else STORED_0_30)
            printed[0] = round(t + 0.1, 6)
        progress = tracker.current()
        return progress.hint_after(0) if progress is not None else Hint.NONE

    cadence = PollCadence(NORMAL_S, due, clock=time.clock)
    while time.clock() < 60.0:
        cadence.wait(time.sleep, None)
    assert cadence.windows == 2
    assert cadence.fast_polls <= 2 * PER_WINDOW + 2


def test_a_log_that_keeps_starting_and_storing_runs_opens_at_most_the_windows_of_one_job() -> None:
    """A hostile log cycling a 1-step run and its stored line every second for a minute: one job's cadence
    opens WINDOWS_PER_JOB windows at most (a batch's rounds, one per clip and level, are not capped)."""
    time = FakeTime()

    def due() -> Hint:
        t = time.clock() % 1.0
        return Hint.NONE if t < 0.4 else Hint.DENOISED if t < 0.7 else Hint.STORED

    cadence = PollCadence(NORMAL_S, due, clock=time.clock)
    while time.clock() < 60.0:
        cadence.wait(time.sleep, None)
    assert cadence.windows == WINDOWS_PER_JOB
    assert cadence.fast_polls <= WINDOWS_PER_JOB * PER_WINDOW + 2


# ---- remote servers ------------------------------------------------------------------------------
def test_a_remote_servers_first_job_is_polled_at_the_normal_interval_only(clocked) -> None:
    """No log, no hint (the CLI's --url, a remote node): no fast poll before anything is learned, and no
    stored-line timing; the second job of the kind is expected at the learned time, as before."""
    server, client = clocked([12.0, 12.0])
    first = client.generate(REQUEST, due=generate_cmd._denoised(None))
    job = server.jobs[0]
    assert len(job.polls) <= 12.0 / NORMAL_S + 2 and job.seen_done_at - job.end <= NORMAL_S + 1e-6
    assert "stored_hint" not in first.timings
    client.generate(REQUEST)
    second = server.jobs[1]
    assert second.seen_done_at - second.end <= FAST_POLL_S + 1e-6
