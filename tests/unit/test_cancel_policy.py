"""The cancel policy: drain a cancelled job's denoise, or restart the server, by their costs."""
from __future__ import annotations

from typing import Optional

from vllm_omni_launcher.server.supervision.cancel_policy import DRAIN, NOTHING, RESTART, CancelPolicy, LaunchClock
from vllm_omni_launcher.server.logs.logwatch import DenoiseProgress

NOW = 1000.0
POLICY = CancelPolicy(grace_s=15.0, ratio=1.2, slack_s=5.0)


def running(step: int, total: int, sps: Optional[float], last_redraw_ago: float = 0.0) -> DenoiseProgress:
    eta = None if sps is None else (total - step) * sps
    return DenoiseProgress(run_id=3, step=step, total=total, seconds_per_step=sps, eta_s=eta,
                           updated_at=NOW - last_redraw_ago, started_at=NOW - 60)


def test_a_queued_job_is_only_deleted() -> None:
    decision = POLICY.decide(running(3, 40, 31.0), 80.0, queued=True, now=NOW)
    assert decision.action == NOTHING and "queued" in decision.text and decision.remaining_s is None


def test_a_short_rest_drains_and_says_when_the_gpu_is_free() -> None:
    # 4-step distilled job cancelled at step 1: ~7 s left against an 80 s restart
    decision = POLICY.decide(running(1, 4, 2.42), 80.0, now=NOW)
    assert decision.action == DRAIN and not decision.restart
    assert abs(decision.remaining_s - 3 * 2.42) < 1e-6
    assert "drain" in decision.text and "GPU free in ~7 s" in decision.text and "~80 s" in decision.text


def test_a_long_rest_restarts_after_the_grace() -> None:
    # A14B at 720p on one H200: ~31 s per step, cancelled at step 3 of 40
    decision = POLICY.decide(running(3, 40, 31.48), 80.0, now=NOW)
    assert decision.action == RESTART and decision.restart
    assert decision.grace_left_s == 15.0 and "in 15 s unless the job ends first" in decision.text
    assert "~1165 s more" in decision.text and "step 3/40" in decision.text


def test_break_even_includes_the_grace_ratio_and_slack() -> None:
    restart_s = 80.0
    threshold = 15.0 + 1.2 * restart_s + 5.0          # 116 s
    just_below = running(0, 100, (threshold - 0.5) / 100)
    just_above = running(0, 100, (threshold + 0.5) / 100)
    assert POLICY.decide(just_below, restart_s, now=NOW).action == DRAIN
    assert POLICY.decide(just_above, restart_s, now=NOW).action == RESTART
    # once the grace has passed, only the restart itself (with its margin) is weighed
    later = POLICY.decide(running(0, 100, 1.05), restart_s, since_cancel_s=20.0, now=NOW)
    assert later.action == RESTART and later.grace_left_s == 0.0 and "now" in later.text


def test_89_s_of_denoise_left_drains_rather_than_an_80_s_restart() -> None:
    # a measured H200 run: ~89 s of denoise left, the server back 80 s after a restart (plus 15 s grace)
    decision = POLICY.decide(running(3, 40, 89.0 / 37), 80.0, now=NOW)
    assert decision.action == DRAIN


def test_unknown_rate_counts_the_time_the_current_step_has_taken() -> None:
    fresh = POLICY.decide(running(0, 40, None, last_redraw_ago=0.5), 60.0, now=NOW)
    assert fresh.action == DRAIN and fresh.remaining_s == 40 * 0.5 and "rate not known yet" in fresh.text
    slow = POLICY.decide(running(0, 40, None, last_redraw_ago=10.0), 60.0, now=NOW)
    assert slow.action == RESTART and slow.remaining_s == 400.0


def test_a_stalled_step_soon_costs_more_than_a_restart() -> None:
    # the bar said 0.02 s/step, but step 1 has not ended for 20 s: a hang
    assert POLICY.decide(running(1, 20, 0.02, last_redraw_ago=0.1), 60.0, now=NOW).action == DRAIN
    stalled = POLICY.decide(running(1, 20, 0.02, last_redraw_ago=20.0), 60.0, since_cancel_s=20.0, now=NOW)
    assert stalled.action == RESTART and stalled.remaining_s == 19 * 20.0


def test_without_a_measured_restart_time_it_restarts_only_after_the_grace() -> None:
    within = POLICY.decide(running(1, 4, 1.0), None, since_cancel_s=3.0, now=NOW)
    assert within.action == DRAIN and within.restart_s is None and "not measured" in within.text
    after = POLICY.decide(running(1, 4, 1.0), None, since_cancel_s=15.0, now=NOW)
    assert after.action == RESTART


def test_nothing_to_weigh_when_no_denoise_of_the_job_runs() -> None:
    assert POLICY.decide(None, 60.0, now=NOW).action == NOTHING
    done = DenoiseProgress(3, 4, 4, 1.0, 0.0, NOW, NOW - 4, done=True)
    assert POLICY.decide(done, 60.0, now=NOW).action == NOTHING


def test_launch_clock_leaves_out_the_download(monkeypatch) -> None:
    clock_now = [100.0]
    monkeypatch.setattr("vllm_omni_launcher.server.supervision.cancel_policy.time.monotonic", lambda: clock_now[0])
    clock = LaunchClock()
    assert clock.last_s is None                       # never started: nothing measured
    clock.started()
    clock_now[0] = 102.0
    clock.phase(True)                                 # downloading weights for 30 s
    clock_now[0] = 132.0
    clock.phase(False)
    clock_now[0] = 150.0
    clock.ready()
    assert clock.last_s == 20.0
