"""Fast polling happens only in a short window around a job's expected end (client/poll_window.py).

The server runs on a fake clock that the client's sleeps advance (tests/helpers/clocked_jobs.py).
Hostile for the old rule (poll every 10 ms from 90% of the estimate on, without end): a job that
overruns the estimate.
"""
from __future__ import annotations

from dataclasses import replace

from clocked_jobs import NORMAL_S, REQUEST, FakeTime, clocked, polls_between  # noqa: F401 (clocked: a fixture)
from vllm_omni_launcher.client.api import VideoRequest
from vllm_omni_launcher.client.poll_window import FAST_POLL_S, FAST_WINDOW_S, HINT_CHECK_S, LEAD_S, Hint, PollCadence


def test_a_job_that_overruns_the_learned_time_gets_one_short_fast_window(clocked) -> None:
    server, client = clocked([10.0, 10.0, 20.0])
    for seed in range(3):
        client.generate(replace(REQUEST, seed=seed))
    overrun = server.jobs[2]
    budget = round(FAST_WINDOW_S / FAST_POLL_S)
    assert len(overrun.polls) <= 20.0 / NORMAL_S + budget + 5, len(overrun.polls)    # the old rule: ~1100
    assert polls_between(overrun, 10.0 - LEAD_S, 10.0 - LEAD_S + FAST_WINDOW_S) >= budget - 5   # fast around 10 s
    after = polls_between(overrun, 10.0 - LEAD_S + FAST_WINDOW_S + 0.01, 20.0)
    assert after <= (20.0 - 11.0) / NORMAL_S + 2, after                             # then the normal interval
    assert overrun.seen_done_at - overrun.end <= NORMAL_S + 1e-6


def test_a_plain_generate_notices_a_job_of_a_known_kind_within_a_fast_poll(clocked) -> None:
    server, client = clocked([10.0, 10.0, 10.0])
    for seed in range(3):
        client.generate(replace(REQUEST, seed=seed))
    first, second, third = server.jobs
    assert first.seen_done_at - first.end <= NORMAL_S + 1e-6            # nothing known yet: the normal interval
    for job in (second, third):
        assert job.seen_done_at - job.end <= FAST_POLL_S + 1e-6          # learned from the first
        assert len(job.polls) <= 10.0 / NORMAL_S + FAST_WINDOW_S / FAST_POLL_S + 5


def test_another_kind_of_job_is_not_expected_at_a_learned_time(clocked) -> None:
    server, client = clocked([10.0, 3.0])
    client.generate(REQUEST)
    client.generate(VideoRequest("a cat", width=64, height=64, num_frames=5, fps=16, steps=40))   # 10x the steps
    other = server.jobs[1]
    assert polls_between(other, 0.0, 3.0) <= 3.0 / NORMAL_S + 2         # no window at 10 s's time, none at all


def test_a_hint_that_stays_true_opens_one_window(clocked) -> None:
    server, client = clocked([30.0])
    time = server.time
    client.generate(REQUEST, due=lambda: time.clock() >= 5.0)           # "last denoise step seen" at 5 s
    (job,) = server.jobs
    assert polls_between(job, 5.0, 5.0 + FAST_WINDOW_S) >= FAST_WINDOW_S / FAST_POLL_S - 5
    assert polls_between(job, 5.0 + FAST_WINDOW_S + 0.01, 30.0) <= (30.0 - 6.5) / NORMAL_S + 2


def test_the_hint_and_the_learned_time_after_it_place_the_next_window(clocked) -> None:
    server, client = clocked([12.0, 12.0])
    time = server.time
    for seed in range(2):
        start = time.clock()                                            # the job starts running at once
        client.generate(replace(REQUEST, seed=seed), due=lambda s=start: time.clock() >= s + 5.0)
    first, second = server.jobs
    assert first.seen_done_at - first.end <= NORMAL_S + 1e-6             # 7 s after the hint: past its window
    assert second.seen_done_at - second.end <= FAST_POLL_S + 1e-6        # the window now opens near 12 s
    assert polls_between(second, 5.0 + FAST_WINDOW_S, 12.0 - LEAD_S - 0.01) <= (12.0 - 5.0) / NORMAL_S + 2


def test_each_rising_edge_of_a_batch_hint_opens_a_window() -> None:
    time = FakeTime()
    edges = [(2.0, 2.5), (6.0, 6.5)]                    # two clips' last denoise steps
    cadence = PollCadence(NORMAL_S, lambda: any(a <= time.clock() < b for a, b in edges), clock=time.clock)
    while time.clock() < 12.0:
        cadence.wait(time.sleep, None)
    per_window = FAST_WINDOW_S / FAST_POLL_S
    assert 2 * per_window - 4 <= cadence.fast_polls <= 2 * per_window + 2


def test_after_the_last_denoise_step_the_stored_line_is_polled_on_within_a_hint_check() -> None:
    """Once the hint says DENOISED, it is read every HINT_CHECK_S, in a fast window or not, so the rise to STORED
    (the job is completed right after) is polled on at once, not at the end of a FAST_POLL_S sleep; before
    that the hint is read every FAST_POLL_S, as a job's denoise can take minutes."""
    for window_open in (True, False):
        time = FakeTime()
        stored_at = 4.0 + (0.3 if window_open else 3.0) + 0.001     # inside the DENOISED window, or after it
        cadence = PollCadence(NORMAL_S, lambda: Hint.STORED if time.clock() >= stored_at else
                              Hint.DENOISED if time.clock() >= 4.0 else Hint.NONE, clock=time.clock)
        reads = []
        real_look = cadence._look
        cadence._look = lambda now: (reads.append(now), real_look(now))[1]   # type: ignore[method-assign]
        while time.clock() < stored_at:
            cadence.wait(time.sleep, None)
        assert time.clock() - stored_at <= HINT_CHECK_S + 1e-9, window_open    # the next poll goes out now
        before = [b - a for a, b in zip(reads, reads[1:]) if b < 4.0 and b - a > 1e-9]   # a poll reads it too
        assert before and max(before) <= FAST_POLL_S + 1e-6 and min(before) > HINT_CHECK_S + 1e-6


def test_the_time_after_the_hint_carries_over_to_another_step_count_of_the_same_shape(clocked) -> None:
    """What follows the last denoise step (decode, postprocess, encode) does not depend on the steps: a job
    with other steps is noticed within a fast poll once one of its shape taught the time after the hint."""
    server, client = clocked([12.0, 17.0])
    time = server.time
    for steps, hint_s in ((4, 5.0), (8, 10.0)):                        # 7 s after the hint, both
        start = time.clock()
        client.generate(replace(REQUEST, steps=steps, guidance=3.0 + steps),
                        due=lambda s=start, h=hint_s: time.clock() >= s + h)
    first, second = server.jobs
    assert first.seen_done_at - first.end <= NORMAL_S + 1e-6            # nothing learned yet
    assert second.seen_done_at - second.end <= FAST_POLL_S + 1e-6       # learned from the 4-step job
    assert polls_between(second, 10.0 + FAST_WINDOW_S, 17.0 - LEAD_S - 0.01) <= 7.0 / NORMAL_S + 2


def test_the_time_after_the_hint_is_not_carried_over_to_another_output(clocked) -> None:
    """Only the denoise-only fields are left out: a job whose output differs (here its fps, part of what the
    MP4 encode makes) learns its own time after the hint."""
    server, client = clocked([12.0, 12.0])
    time = server.time
    for fps in (16, 8):
        start = time.clock()
        client.generate(replace(REQUEST, fps=fps), due=lambda s=start: time.clock() >= s + 5.0)
    second = server.jobs[1]
    assert second.seen_done_at - second.end > FAST_POLL_S + 1e-6         # not learned: the window opened at the hint
    assert polls_between(second, 5.0 + FAST_WINDOW_S + 0.01, 12.0) <= (12.0 - 6.5) / NORMAL_S + 2
