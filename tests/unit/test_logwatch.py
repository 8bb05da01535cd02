"""The log parsers on the real vLLM-Omni 0.26 server logs (tests/fixtures/logs) and edge cases."""
from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from vllm_omni_launcher.server.logs import logwatch
from vllm_omni_launcher.server.logs.log_follower import LogFollower, Splitter, read_tail, split_text
from vllm_omni_launcher.server.logs.logwatch import ProgressTracker, parse_bar, parse_phase

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
TI2V_1GPU = LOGS / "vllm-omni-0.26-serve-ti2v-tiny-1gpu.log"
T2V_2GPU = LOGS / "vllm-omni-0.26-serve-t2v-tiny-cfg2-2gpu.log"
# plus the logs of our own supervisor's real run on 2x H200 (bench/results, issue: real GPUs)
OUR_RUN = sorted((Path(__file__).resolve().parents[2] / "bench" / "results" / "logs").glob("*.log"))
SAMPLES = [TI2V_1GPU, T2V_2GPU, *OUR_RUN]


def _segments(path: Path) -> list[str]:
    return [text for text, _ in Splitter().feed(path.read_bytes(), final=True)]


def _phases(segments: list[str]) -> list[str]:
    seen: list[str] = []
    for seg in segments:
        change = parse_phase(seg)
        if change is not None and change.phase and (not seen or seen[-1] != change.phase):
            seen.append(change.phase)
    return seen


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_startup_phases_in_order(path: Path) -> None:
    phases = _phases(_segments(path))
    assert phases[0] == logwatch.STARTING
    assert phases == sorted(phases, key=logwatch.PHASE_ORDER.index), phases
    assert logwatch.LOADING in phases and logwatch.WARMUP in phases
    texts = [c.text for c in map(parse_phase, _segments(path)) if c is not None]
    assert any("Model loaded (0.00" in t for t in texts)
    assert texts[-1] == "Warm-up done; HTTP server starting"


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_server_version_and_up_lines(path: Path) -> None:
    segments = _segments(path)
    assert {logwatch.server_version(s) for s in segments} - {None} == {(0, 26)}
    assert any(logwatch.is_server_up(s) for s in segments)
    assert not any(logwatch.is_oom_line(s) for s in segments)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_warmup_run_is_not_a_job_and_the_job_run_is_tracked(path: Path) -> None:
    tracker = ProgressTracker()
    updates = []
    for seg in _segments(path):
        if tracker.feed(seg):
            updates.append(tracker.current())
    assert updates, "the job's denoise bar was not recognised"
    assert {u.run_id for u in updates} == {1}, "the warm-up dummy run (0/1) must not count as a job"
    assert {u.total for u in updates} == {4}
    steps = [u.step for u in updates]
    assert steps[0] == 0 and steps[-1] == 4 and steps == sorted(steps)
    last = updates[-1]
    assert last.done and last.eta_s == 0.0 and not last.aborted


def test_two_gpu_sample_rate_and_eta() -> None:
    tracker = ProgressTracker(clock=lambda: 100.0)
    mid = None
    for seg in _segments(T2V_2GPU):
        if tracker.feed(seg) and tracker.current().step == 1:
            mid = tracker.current()
    assert mid is not None
    assert mid.seconds_per_step == pytest.approx(1 / 1.56)
    assert mid.eta_s == pytest.approx(3 / 1.56)


def test_parse_bar_forms() -> None:
    start = parse_bar("  0%|          | 0/4 [00:00<?, ?it/s]")
    assert start is not None and (start.step, start.total, start.seconds_per_step, start.remaining_s) == (0, 4, None,
                                                                                                         None)
    slow = parse_bar("100%|██████████| 1/1 [00:53<00:00, 53.46s/it]")
    assert slow is not None and slow.seconds_per_step == pytest.approx(53.46) and slow.remaining_s == 0
    fast = parse_bar(" 25%|██▌       | 1/4 [00:00<00:01,  1.56it/s]")
    assert fast is not None and fast.seconds_per_step == pytest.approx(1 / 1.56) and fast.remaining_s == 1
    long = parse_bar(" 50%|█████     | 20/40 [10:00<1:10:00, 30.00s/it]")
    assert long is not None and long.remaining_s == 4200
    tagged = parse_bar("(Worker pid=12) 50%|█████     | 2/4 [00:01<00:01,  2.00it/s]")
    assert tagged is not None and tagged.step == 2
    # described bars (weight loading, downloads) and half-written redraws are not denoise progress
    assert parse_bar("Loading weights:  45%|████▌     | 10/22 [00:00<00:00, 99.0it/s]") is None
    assert parse_bar("Multi-thread loading shards:   0% Completed | 0/1 [00:00<?, ?it/s]") is None
    assert parse_bar("  0%|          | 0/4 [00:00<?, ?it/s") is None
    assert parse_bar(" 75%|███████▌  | 3/4 [00:00<00:00, 20.3") is None


def test_new_run_per_bar_and_run_ids_keep_counting() -> None:
    now = [1000.0]
    tracker = ProgressTracker(clock=lambda: now[0])
    tracker.mark_server_up()
    for i in range(3):
        tracker.feed(f"{i * 33:3d}%|          | {i}/2 [00:0{i}<00:00,  1.00it/s]")
    assert tracker.current().run_id == 1 and tracker.current().done
    assert not tracker.feed("100%|          | 2/2 [00:02<00:00,  1.00it/s]"), "tqdm's closing redraw"
    assert tracker.current().run_id == 1
    # a job that fails mid-way (OOM): the run is aborted; tqdm's closing redraw does not revive it
    tracker.feed("  0%|          | 0/2 [00:00<?, ?it/s]")
    tracker.feed(" 50%|          | 1/2 [00:01<00:01,  1.00it/s]")
    tracker.abort_current()
    assert not tracker.feed(" 50%|          | 1/2 [00:01<00:01,  1.00it/s]")
    assert not tracker.feed("100%|          | 2/2 [00:02<00:00,  1.00it/s]"), "an aborted run's GPU tail"
    assert tracker.current().run_id == 2 and tracker.current().aborted and tracker.current().step == 1
    tracker.feed("  0%|          | 0/2 [00:00<?, ?it/s]")
    tracker.feed("100%|          | 2/2 [00:02<00:00,  1.00it/s]")
    assert tracker.current().run_id == 3 and tracker.current().done
    tracker.feed("  0%|          | 0/8 [00:00<?, ?it/s]")
    assert tracker.current().run_id == 4 and tracker.current().step == 0 and tracker.current().eta_s is None
    tracker.feed(" 12%|█         | 1/8 [00:02<00:14,  2.00s/it]")
    assert tracker.current().eta_s == pytest.approx(14.0)
    now[0] += 5
    assert tracker.current().eta_s == pytest.approx(9.0), "ETA counts down between redraws"
    now[0] += 60
    assert tracker.current().eta_s == 0.0
    # a restart aborts the run in flight; the next server's warm-up is skipped again
    tracker.new_launch()
    assert tracker.current().aborted
    tracker.feed("dummy run to warm up the model")
    tracker.feed("  0%|          | 0/1 [00:00<?, ?it/s]")
    tracker.feed("100%|██████████| 1/1 [00:01<00:00,  1.00s/it]")
    assert tracker.current().run_id == 4
    tracker.feed("INFO:     Application startup complete.")
    tracker.feed("  0%|          | 0/3 [00:00<?, ?it/s]")
    assert tracker.current().run_id == 5


def test_bars_before_ready_without_markers_are_ignored_until_server_up() -> None:
    tracker = ProgressTracker()
    assert not tracker.feed("  0%|          | 0/2 [00:00<?, ?it/s]")
    assert tracker.current() is None
    tracker.mark_server_up()
    assert tracker.feed("  0%|          | 0/2 [00:00<?, ?it/s]")
    assert tracker.current().run_id == 1


def test_splitter_handles_cr_crlf_and_split_utf8() -> None:
    data = "a\r\nb\rc\n█x".encode()
    out = []
    sp = Splitter()
    for i in range(len(data)):                 # one byte at a time
        out += sp.feed(data[i:i + 1])
    assert out == [("a", True), ("b", False), ("c", True)]
    assert sp.pending == "█x"
    assert sp.feed(b"", final=True) == [("█x", True)]
    assert split_text("x\r") == [("x", False)]


def test_phase_lines_for_downloads_and_loading_bars() -> None:
    assert parse_phase("Fetching 12 files:  50%|█████     | 6/12 [00:10<00:10,  1.7s/it]").phase == logwatch.DOWNLOADING
    assert parse_phase("(APIServer pid=9) INFO 11-30 [hub_prefetch.py:299] Prefetching 5 subfolders for "
                       "Wan-AI/Wan2.2-T2V-A14B-Diffusers").phase == logwatch.DOWNLOADING
    assert parse_phase("INFO [hub_prefetch.py:344] Prefetch complete for x").phase == logwatch.LOADING
    change = parse_phase("Multi-thread loading shards:  50% Completed | 3/6 [00:01<00:01,  2.0it/s]")
    assert change.phase == logwatch.LOADING and "3/6" in change.text
    assert parse_phase("INFO [logo.py:52] hello") is None


def _write_slowly(src: bytes, dest: Path, stop: threading.Event) -> None:
    rnd = random.Random(7)
    with open(dest, "ab", buffering=0) as fh:
        i = 0
        while i < len(src):
            n = rnd.randint(1, 900)
            fh.write(src[i:i + n])
            i += n
            if rnd.random() < 0.3:
                time.sleep(0.001)
    stop.set()


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_follower_on_a_growing_file_matches_whole_file_parse(path: Path, tmp_path: Path) -> None:
    dest = tmp_path / "server.log"
    dest.write_bytes(b"")
    tracker = ProgressTracker()
    phases: list[str] = []

    def on_segment(text: str, ends_line: bool) -> None:
        if tracker.feed(text):
            return
        change = parse_phase(text)
        if change is not None and change.phase and (not phases or phases[-1] != change.phase):
            phases.append(change.phase)

    follower = LogFollower(str(dest), on_segment, interval_s=0.001).start()
    done = threading.Event()
    writer = threading.Thread(target=_write_slowly, args=(path.read_bytes(), dest, done))
    writer.start()
    writer.join()
    follower.stop()
    assert phases == _phases(_segments(path))
    cur = tracker.current()
    assert cur is not None and cur.run_id == 1 and cur.done and cur.total == 4
    tail = follower.tail(400)
    assert any("Application startup complete" in line for line in tail)
    assert "\r" not in "".join(tail)


def test_follower_peeks_at_an_unterminated_redraw(tmp_path: Path) -> None:
    dest = tmp_path / "server.log"
    dest.write_bytes(b"INFO:     Application startup complete.\n\r  0%|          | 0/5 [00:00<?, ?it/s]")
    tracker = ProgressTracker()
    follower = LogFollower(str(dest), lambda t, e: tracker.feed(t))
    follower.poll_once()
    assert tracker.current() is not None and tracker.current().step == 0
    with open(dest, "ab") as fh:
        fh.write(b"\r 20%|##        | 1/5 [00:01<00:04,  1.00it/s]")
    follower.poll_once()
    assert tracker.current().step == 1 and tracker.current().run_id == 1, "the peeked 0/5 must not start a 2nd run"


def test_read_tail_collapses_redraws() -> None:
    lines = read_tail(str(TI2V_1GPU), lines=400)
    bars = [line for line in lines if "| 4/4 [" in line]
    assert bars and all("\r" not in line for line in lines)


# What a uniproc server writes (seen from the stub, which runs vLLM's real logging): ANSI
# coloured process tags, and other threads' log lines glued right after a redraw.
GLUED = (b"\x1b[0;36m(APIServer pid=7)\x1b[0;0m INFO 11-30 05:32:36 [launcher.py:37] Available routes are:\n"
         b"\x1b[0;36m(APIServer pid=7)\x1b[0;0m \r  0%|          | 0/6 [00:00<?, ?it/s]"
         b"\x1b[0;36m(APIServer pid=7)\x1b[0;0m INFO:     127.0.0.1:38536 - \"GET /v1/videos/x HTTP/1.1\" 200 OK\n"
         b"\r 17%|\xe2\x96\x88\xe2\x96\x8b        | 1/6 [00:00<00:01,  3.33it/s]"
         b"\x1b[0;36m(APIServer pid=7)\x1b[0;0m INFO:     127.0.0.1:38536 - \"GET /v1/videos/x HTTP/1.1\" 200 OK\n"
         b"\r 50%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88     | 3/6 [00:00<00:00,  3.33it/s]"
         b" 50%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88     | 3/6 [00:00<00:00,  3.33it/s]\n"
         b"\x1b[0;36m(APIServer pid=7)\x1b[0;0m ERROR 11-30 05:32:37 [inline_stage_diffusion_client.py:192] "
         b"Diffusion request v-1 failed: CUDA out of memory. Tried to allocate 2.00 GiB.\n")


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_ansi_tags_and_glued_log_lines(tmp_path: Path, chunk: int) -> None:
    dest = tmp_path / "server.log"
    dest.write_bytes(b"")
    tracker = ProgressTracker()
    others: list[str] = []

    def on_segment(text: str, ends_line: bool) -> None:
        tracker.feed(text)
        if logwatch.is_oom_line(text) or "GET /v1/videos" in text:
            others.append(text)

    follower = LogFollower(str(dest), on_segment)
    runs = set()
    for i in range(0, len(GLUED), chunk):
        with open(dest, "ab") as fh:
            fh.write(GLUED[i:i + chunk])
        follower.poll_once()
        if tracker.current() is not None:
            runs.add(tracker.current().run_id)
    follower.drain()
    assert runs == {1}, "one job: the peeked 0/6 and its glued complete form are the same run"
    assert tracker.current().step == 3 and not tracker.current().done
    assert sum("GET /v1/videos" in t for t in others) == 2, "log lines glued after a redraw are still seen"
    assert any(logwatch.is_oom_line(t) for t in others)
    assert not any("\x1b" in line for line in follower.tail(20))
