"""A hostile or broken server's log cannot cost us more than its length (issue 24): one endless line is read in
linear work with a bounded head kept, and a log flooded faster than it is read still rotates within its bound."""
from __future__ import annotations

import os
from pathlib import Path

from vllm_omni_launcher.server.logs import log_follower
from vllm_omni_launcher.server.logs.log_follower import MAX_SEGMENT_CHARS, READ_CHUNK_BYTES, LogFollower, Splitter

MIB = 1024 * 1024


def test_a_32_mib_line_is_scanned_once_and_kept_as_a_bounded_head(tmp_path: Path, monkeypatch) -> None:
    """The old follower rescanned (and cleaned) the whole unfinished line on every 1 MiB read: 32 reads of a
    growing buffer, 528 M characters for this line (34 s of CPU). Now each character is scanned once, and what
    is cleaned and parsed per read is bounded by the line cap, whatever the line's length."""
    cleaned = [0]
    real_clean = log_follower.clean

    def counting_clean(text: str) -> str:
        cleaned[0] += len(text)
        return real_clean(text)
    monkeypatch.setattr(log_follower, "clean", counting_clean)
    log = tmp_path / "server.log"
    line = b"A" * (32 * MIB)
    log.write_bytes(b"INFO before\n" + line + b"\nINFO after\n")
    segments: list[tuple[str, bool]] = []
    follower = LogFollower(str(log), lambda text, ends: segments.append((text, ends)))
    reads = 0
    while follower.poll_once():
        reads += 1
    total = log.stat().st_size
    assert reads == -(-total // READ_CHUNK_BYTES), "read in 1 MiB steps, each byte once"
    assert follower._splitter.scanned == total, "every character looked at exactly once"         # noqa: SLF001
    assert cleaned[0] <= (reads + 3) * (MAX_SEGMENT_CHARS + 100), "cleaning is bounded per read, not per line"
    texts = [text for text, _ in segments]
    assert texts[0] == "INFO before" and texts[-1] == "INFO after"
    cut = 32 * MIB - MAX_SEGMENT_CHARS
    assert texts[1] == "A" * MAX_SEGMENT_CHARS + f" [... {cut} more characters of this line cut by vllm-omni-launcher]"
    assert follower.tail(2) == [texts[1], "INFO after"], "the error report keeps the bounded head too"


def test_the_line_cap_holds_across_reads_carriage_returns_and_split_utf8() -> None:
    sp = Splitter(max_chars=8)
    data = "0123456789█abc\r\n█\rxy".encode()
    out = []
    for i in range(len(data)):                # one byte at a time: breaks and UTF-8 split at every point
        out += sp.feed(data[i:i + 1])
    assert out == [("01234567 [... 6 more characters of this line cut by vllm-omni-launcher]", True), ("█", False)]
    assert sp.pending == "xy" and sp.scanned == len(data.decode()) and sp.cut_chars == 6
    assert sp.feed(b"", final=True) == [("xy", True)]


def test_a_flood_faster_than_the_reader_still_rotates_within_the_bound(tmp_path: Path) -> None:
    """The server appends (O_APPEND, as its stdout is opened) 1.5 MiB between two reads of at most 1 MiB: the
    follower never catches up. The old rule (rotate only once caught up) let such a log grow without end
    (396 MiB past a 32 MiB threshold); now every read that finds the file past max_bytes rotates it, so the
    file never exceeds max_bytes plus what is written between two reads."""
    log = tmp_path / "server.log"
    max_bytes, burst = 2 * MIB, 3 * MIB // 2
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    follower = LogFollower(str(log), lambda text, ends: None, max_bytes=max_bytes)
    chunk = (b"flood line " * 1000 + b"\n") * (burst // 11001 + 1)
    largest = 0
    try:
        for _ in range(10):                               # 15 MiB in all
            os.write(fd, chunk[:burst])
            largest = max(largest, log.stat().st_size)
            assert follower.poll_once()
    finally:
        os.close(fd)
    assert largest <= max_bytes + burst, f"the log reached {largest / MIB:.1f} MiB"
    assert follower.skipped_bytes > 0 and any("skipped" in line for line in follower.tail(400))
    rotated = Path(str(log) + ".1")
    assert 0 < rotated.stat().st_size <= log_follower.ROTATED_KEEP_BYTES
