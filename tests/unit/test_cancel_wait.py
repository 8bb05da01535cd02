"""cancel_wait: the lock wait of the registry's and the supervisor's starts ends on cancel, and a
broken cancel callback reads as "not cancelled" instead of breaking the start."""
from __future__ import annotations

import threading

from vllm_omni_launcher.server.process import cancel_wait


def test_acquire_takes_a_free_lock_without_asking() -> None:
    lock = threading.Lock()
    asked: list[bool] = []
    assert cancel_wait.acquire(lock, lambda: asked.append(True) or True)
    assert lock.locked() and asked == []


def test_acquire_gives_up_when_cancel_turns_true_while_another_holds_the_lock() -> None:
    lock = threading.RLock()
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            release.wait(30)
    t = threading.Thread(target=holder, daemon=True)
    t.start()
    assert held.wait(30)
    calls = {"n": 0}

    def cancel_on_third_look() -> bool:
        calls["n"] += 1
        return calls["n"] >= 3
    try:
        assert cancel_wait.acquire(lock, cancel_on_third_look) is False
        assert calls["n"] == 3              # it looked at the flag while waiting, and stopped at once
    finally:
        release.set()
        t.join(30)
    assert cancel_wait.acquire(lock, lambda: True)      # free again: taken, the flag not consulted


def test_quiet_turns_a_raising_callback_into_not_cancelled() -> None:
    def broken() -> bool:
        raise RuntimeError("a node's interrupt check broke")
    assert cancel_wait.quiet(broken)() is False
    assert cancel_wait.quiet(None)() is False
    assert cancel_wait.quiet(lambda: 1)() is True
