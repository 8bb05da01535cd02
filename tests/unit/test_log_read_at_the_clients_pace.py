"""After a job's last denoise step, the server's "persisted ... output file." line is next, and the client
looks for it every few milliseconds (client/poll_window.HINT_CHECK_S). The log's follower keeps its own interval
otherwise; while the hint says DENOISED each look nudges it to read now, so the line is not up to a whole interval
late. Before the last step, and once the line is in, nothing is nudged."""
from __future__ import annotations

import threading
from pathlib import Path

from vllm_omni_launcher.client.poll_window import Hint
from vllm_omni_launcher.server.logs.log_follower import LogFollower
from vllm_omni_launcher.server.logs.logwatch import ProgressTracker, fast_poll_hint

STORED = "INFO [helpers.py:432] Video request video_gen_1 persisted video_gen_1 output file."


def test_a_nudge_makes_the_follower_read_now_not_after_its_interval(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    first, arrived = threading.Event(), threading.Event()

    def on_segment(text: str, ends_line: bool) -> None:
        (arrived if "persisted" in text else first).set()

    log.write_text("INFO server up\n")
    follower = LogFollower(str(log), on_segment, interval_s=3600.0).start()   # would wait an hour on its own
    try:
        assert first.wait(120)                # its first read is done: from here it waits on its interval
        with log.open("a") as fh:
            fh.write(STORED + "\n")
        follower.nudge()
        assert arrived.wait(120), "the nudged follower did not read the new line"
    finally:
        follower.stop()


def test_stop_still_ends_a_follower_waiting_on_a_long_interval(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("")
    follower = LogFollower(str(log), lambda text, ends: None, interval_s=3600.0).start()
    follower.stop()                            # without the wake it would sleep out its hour
    follower._thread.join(120)
    assert not follower._thread.is_alive()


def test_the_hint_nudges_the_log_only_between_the_last_step_and_the_stored_line() -> None:
    tracker = ProgressTracker(clock=lambda: 0.0)
    tracker.mark_server_up()
    nudges: list[int] = []
    floor, due = fast_poll_hint(tracker.current, lambda: nudges.append(1))
    assert floor == -1
    assert due() == Hint.NONE and not nudges                       # no run yet
    tracker.feed("  0%|          | 0/4 [00:00<?, ?it/s]")
    tracker.feed(" 50%|█████     | 2/4 [00:03<00:03,  1.76s/it]")
    assert due() == Hint.NONE and not nudges                       # still denoising
    tracker.feed("100%|██████████| 4/4 [00:07<00:00,  1.76s/it]")
    assert due() == Hint.DENOISED and due() == Hint.DENOISED and len(nudges) == 2   # every look while due
    tracker.feed(STORED)
    assert due() == Hint.STORED and len(nudges) == 2                # the line is in: no more nudges
