"""The restart budget: backoff, give-up after too many restarts, the window sliding on.

The numbers are the documented policy (README "Supervision", docs/replicas.md: at most 5
restarts in 30 minutes, the delay growing 1, 2, 5, 10, 30, then 60 s), written out here rather
than read back from restart_policy.py, so that a changed constant fails a test."""
from __future__ import annotations

from manual_clock import Clock
from vllm_omni_launcher.server.supervision.restart_policy import RestartPolicy

MINUTE = 60.0


def test_backoff_grows_then_the_policy_gives_up() -> None:
    clock = Clock()
    policy = RestartPolicy(clock=clock)
    delays = []
    for _ in range(5):
        delays.append(policy.next_delay())
        clock.now += 10
    assert delays == [1.0, 2.0, 5.0, 10.0, 30.0]
    assert policy.next_delay() is None, "the sixth crash within the window: give up"
    assert policy.next_delay() is None and policy.recent == 5, "giving up books nothing"
    assert policy.give_up_text() == "Gave up after 5 restarts in 30 minutes"


def test_the_delay_stays_at_a_minute_past_the_end_of_the_backoff() -> None:
    policy = RestartPolicy(max_restarts=8, clock=Clock())
    assert [policy.next_delay() for _ in range(8)] == [1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 60.0, 60.0]


def test_the_default_window_is_thirty_minutes() -> None:
    clock = Clock()
    policy = RestartPolicy(clock=clock)
    for _ in range(5):
        assert policy.next_delay() is not None
    clock.now += 30 * MINUTE - 1
    assert policy.next_delay() is None, "29:59 later the five restarts still count"
    clock.now += 2
    assert policy.recent == 0 and policy.next_delay() == 1.0, "30:01 later they have left the window"


def test_old_restarts_leave_the_window() -> None:
    clock = Clock()
    policy = RestartPolicy(max_restarts=2, window_s=60, clock=clock)
    assert policy.next_delay() == 1.0
    clock.now += 30
    assert policy.next_delay() == 2.0
    assert policy.next_delay() is None
    clock.now += 30
    assert policy.next_delay() is None, "exactly the window's length later: the first still counts"
    clock.now += 1                      # the first restart is older than the window now
    assert policy.recent == 1 and policy.next_delay() == 2.0


def test_restarts_on_purpose_count_and_a_fresh_start_resets() -> None:
    clock = Clock()
    policy = RestartPolicy(max_restarts=3, clock=clock)
    for _ in range(3):
        policy.book()                   # three hard-cancel restarts
    assert policy.next_delay() is None, "a workflow cancelling in a loop cannot restart the server forever"
    policy.reset()
    assert policy.recent == 0 and policy.next_delay() == 1.0


def test_the_supervisor_gives_up_and_says_why(tmp_path) -> None:
    """A crash after ready with the budget spent: failed, with the reason and the crash."""
    from vllm_omni_launcher.server.logs import failures
    from vllm_omni_launcher.server.config.local_config import LocalConfig
    from vllm_omni_launcher.server.launch.spec import LaunchSpec
    from vllm_omni_launcher.server.supervision.supervisor import Supervisor

    policy = RestartPolicy(max_restarts=2)
    policy.book()
    policy.book()
    sup = Supervisor(LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers"), LocalConfig(data_dir=str(tmp_path)),
                     restart_policy=policy)
    seen = []
    sup.listen(seen.append, replay=False)
    sup._recovery.on_exit(1)           # noqa: SLF001 - the monitor's hook for a crash after ready
    status = sup.status()
    assert status.phase == "failed" and status.last_error_kind == failures.CRASH
    assert status.text.startswith("Gave up after 2 restarts in 30 minutes: The vLLM-Omni server exited")
    assert [s.phase for s in seen] == ["failed"], "no restart was attempted"
