"""A server's status reaches its launcher only while that launch lasts (StatusBoard.unlisten).

ComfyUI's node ids are small integers every graph reuses, so a listener kept after the launching
node's run would write the server's later life (keep-alive stop, crash, Stop Server) under an
unrelated node of whatever graph is open. The node layer's side (Local Server, then Stop Server as
node 1) runs against the stub server in tests/contract/test_nodes_stub.py.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from vllm_omni_launcher.server.supervision.status import READY, STARTING, STOPPED, STOPPING, Status, StatusBoard


def _board(before_snapshot: Optional[Callable[[], None]] = None) -> StatusBoard:
    """A board as the supervisor makes one; `before_snapshot` runs inside emit, after it has read
    its listener and before it sends (where a node's unsubscribe can land from another thread)."""
    holder: list[StatusBoard] = []

    def snapshot() -> Status:
        if before_snapshot is not None:
            before_snapshot()
        return Status(ready=False, pid=None, port=None, url=None, generation=1, fingerprint="f", **holder[0].fields())

    holder.append(StatusBoard(threading.RLock(), snapshot))
    return holder[0]


class _Node:
    """A node's reporter as the session subscribes it: a bound method, passed again to unsubscribe."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def launch_status(self, status: Status) -> None:
        self.texts.append(status.text)


def test_after_the_launch_unsubscribes_a_change_reaches_no_one_and_a_new_runs_node_gets_its_own():
    board = _board()
    launching, later = _Node(), _Node()
    board.listen(launching.launch_status)
    board.set(STARTING, "Starting")
    board.set(READY, "Ready: m at http://127.0.0.1:1 (GPU 0)")
    board.unlisten(launching.launch_status)            # a new bound method, equal to the one subscribed
    board.set(STOPPING, "Stopping the server")
    board.set(STOPPED, "Stopped")
    assert launching.texts == ["Starting", "Ready: m at http://127.0.0.1:1 (GPU 0)"]
    board.listen(later.launch_status, replay=True)
    board.set(STARTING, "Starting")
    assert later.texts == ["Stopped", "Starting"]
    assert launching.texts == ["Starting", "Ready: m at http://127.0.0.1:1 (GPU 0)"]


def test_an_ended_launch_unsubscribing_leaves_the_newer_listener():
    """Prestart's console launch ends after a node has subscribed: the node keeps hearing."""
    board = _board()
    console, node = _Node(), _Node()
    board.listen(console.launch_status)
    board.listen(node.launch_status)
    board.unlisten(console.launch_status)
    board.set(STARTING, "Starting")
    assert (console.texts, node.texts) == ([], ["Starting"])


def test_an_unsubscribe_landing_while_a_change_is_being_sent_stops_that_send():
    """emit reads its listener before it takes the snapshot: an unsubscribe in between must win, or
    the text of a change made just after the launch ended would still reach the ended run's node."""
    node = _Node()
    board = _board(before_snapshot=lambda: board.unlisten(node.launch_status) if node.texts else None)
    board.listen(node.launch_status)
    board.set(STARTING, "Starting")                    # sent; the next emit's snapshot unsubscribes
    board.set(STOPPED, "Stopped")
    assert node.texts == ["Starting"]
