"""The restart budget: backoff, give-up after too many restarts, the window sliding on."""
from __future__ import annotations

from vllm_omni_launcher.server.restart_policy import BACKOFF_S, MAX_RESTARTS, WINDOW_S, RestartPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backoff_grows_then_the_policy_gives_up() -> None:
    clock = Clock()
    policy = RestartPolicy(clock=clock)
    delays = []
    for _ in range(MAX_RESTARTS):
        delays.append(policy.next_delay())
        clock.now += 10
    assert delays == list(BACKOFF_S[:MAX_RESTARTS])
    assert policy.next_delay() is None, "the sixth crash within the window: give up"
    assert policy.next_delay() is None and policy.recent == MAX_RESTARTS, "giving up books nothing"
    assert policy.give_up_text() == f"Gave up after {MAX_RESTARTS} restarts in 30 minutes"


def test_old_restarts_leave_the_window() -> None:
    clock = Clock()
    policy = RestartPolicy(max_restarts=2, window_s=60, clock=clock)
    assert policy.next_delay() == BACKOFF_S[0]
    clock.now += 30
    assert policy.next_delay() == BACKOFF_S[1]
    assert policy.next_delay() is None
    clock.now += 31                     # the first restart is older than the window now
    assert policy.recent == 1 and policy.next_delay() == BACKOFF_S[1]


def test_restarts_on_purpose_count_and_a_fresh_start_resets() -> None:
    clock = Clock()
    policy = RestartPolicy(max_restarts=3, clock=clock)
    for _ in range(3):
        policy.book()                   # three hard-cancel restarts
    assert policy.next_delay() is None, "a workflow cancelling in a loop cannot restart the server forever"
    policy.reset()
    assert policy.recent == 0 and policy.next_delay() == BACKOFF_S[0]
    assert RestartPolicy().window_s == WINDOW_S


def test_the_supervisor_gives_up_and_says_why(tmp_path) -> None:
    """A crash after ready with the budget spent: failed, with the reason and the crash."""
    from vllm_omni_launcher.server import failures
    from vllm_omni_launcher.server.local_config import LocalConfig
    from vllm_omni_launcher.server.spec import LaunchSpec
    from vllm_omni_launcher.server.supervisor import Supervisor

    policy = RestartPolicy(max_restarts=2)
    policy.book()
    policy.book()
    sup = Supervisor(LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers"), LocalConfig(data_dir=str(tmp_path)),
                     restart_policy=policy)
    seen = []
    sup.listen(seen.append, replay=False)
    sup.on_exit(1)
    status = sup.status()
    assert status.phase == "failed" and status.last_error_kind == failures.CRASH
    assert status.text.startswith("Gave up after 2 restarts in 30 minutes: The vLLM-Omni server exited")
    assert [s.phase for s in seen] == ["failed"], "no restart was attempted"
