"""Startup progress for the node's bar (issue 11): from the log's bars and the HF cache folder
growing, shown through a status board that reports changes only."""
from __future__ import annotations

import threading
from pathlib import Path

from vllm_omni_launcher.server.logs import logwatch
from vllm_omni_launcher.server.launch.hf_cache import DownloadWatch, has_snapshot, hub_dir, repo_dir
from vllm_omni_launcher.server.logs.logwatch import PhaseChange, parse_phase, warmup_step
from vllm_omni_launcher.server.supervision.status import Status, StatusBoard

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def test_loading_bars_of_the_real_log_carry_progress() -> None:
    from vllm_omni_launcher.server.logs.log_follower import Splitter

    data = (LOGS / "vllm-omni-0.26-serve-ti2v-tiny-1gpu.log").read_bytes()
    changes = [c for c in (parse_phase(t) for t, _ in Splitter().feed(data, final=True)) if c and c.progress]
    assert (0.0, 22.0, "parts") in [c.progress for c in changes] and (22.0, 22.0, "parts") in [c.progress for c in changes]
    assert (1.0, 1.0, "shards") in [c.progress for c in changes]
    assert all(c.phase == logwatch.LOADING for c in changes)
    assert any(c.text == "Multi-thread loading shards: 1/1" for c in changes)


def test_download_bars_in_files_and_bytes() -> None:
    files = parse_phase("Fetching 12 files:  50%|█████     | 6/12 [00:10<00:10,  1.7s/it]")
    assert files.phase == logwatch.DOWNLOADING and files.progress == (6.0, 12.0, "files")
    per_file = parse_phase("model-00001-of-00003.safetensors:  45%|████▌     | 2.15G/4.77G [00:30<00:36, 72.1MB/s]")
    assert per_file.phase == logwatch.DOWNLOADING and per_file.progress == (2150.0, 4770.0, "MB")
    xet = parse_phase("Reconstructing (incomplete total...):  45%|████▌     |  2.1GB / 4.7GB, 72MB/s")
    assert xet.progress == (2100.0, 4700.0, "MB")
    warm = warmup_step(" 50%|█████     | 1/2 [00:00<00:00,  1.0it/s]")
    assert warm.phase == logwatch.WARMUP and warm.progress == (1.0, 2.0, "steps") and "1/2" in warm.text
    assert warmup_step("INFO nothing") is None


def test_download_watch_measures_the_cache_folder_growing(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "hf")}
    model = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
    assert hub_dir(env) == tmp_path / "hf" / "hub" and hub_dir({"HF_HUB_CACHE": "/x"}) == Path("/x")
    blobs = repo_dir(model, env) / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "done").write_bytes(b"a" * 1000)               # from an earlier, interrupted download
    watch = DownloadWatch(model, env, every_s=0.0)
    assert watch.downloaded() is None, "nothing new yet"
    (blobs / "next.incomplete").write_bytes(b"b" * 2_500_000)
    assert watch.due() and watch.downloaded() == 2_500_000
    assert not has_snapshot(model, env)
    (repo_dir(model, env) / "snapshots" / "abc").mkdir(parents=True)
    assert has_snapshot(model, env)


def _board() -> tuple[StatusBoard, list[Status]]:
    lock = threading.RLock()
    holder: list[StatusBoard] = []

    def snapshot() -> Status:
        board = holder[0]
        return Status(ready=False, pid=None, port=None, url=None, generation=1, fingerprint="f", **board.fields())
    board = StatusBoard(lock, snapshot)
    holder.append(board)
    seen: list[Status] = []
    board.listen(seen.append)
    return board, seen


def test_status_board_emits_changes_only_and_phases_move_forward() -> None:
    board, seen = _board()
    board.set("starting", "Starting")
    board.set("starting", "Starting")                        # the same again: not sent
    board.advance(PhaseChange(logwatch.LOADING, "Multi-thread loading shards: 0/2", (0.0, 2.0, "shards")))
    board.advance(PhaseChange(logwatch.LOADING, "Multi-thread loading shards: 0/2", (0.0, 2.0, "shards")))
    board.advance(PhaseChange(logwatch.DOWNLOADING, "Downloading weights"))   # backwards: ignored
    board.advance(PhaseChange(None, "Weights read in 1 s"))               # same phase: progress kept
    board.advance(PhaseChange(logwatch.WARMUP, "Warming up"))             # new phase: progress cleared
    board.emit()                                                         # nothing changed: not sent
    assert [(s.phase, s.text, s.progress) for s in seen] == [
        ("starting", "Starting", None),
        ("loading", "Multi-thread loading shards: 0/2", (0.0, 2.0, "shards")),
        ("loading", "Weights read in 1 s", (0.0, 2.0, "shards")),
        ("warmup", "Warming up", None)]
    board.set("stopping", "Stopping")
    board.advance(PhaseChange(logwatch.READY, "late log line"))           # the log no longer drives it
    assert seen[-1].phase == "stopping"
    late: list[Status] = []
    board.listen(late.append, replay=True)
    assert [s.phase for s in late] == ["stopping"], "a new listener gets the current status once"
