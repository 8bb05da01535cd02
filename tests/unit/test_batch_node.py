"""Generate Batch (nodes/generate_node.py, nodes/batch_session.py) without a server: its schema is
Generate Video's, the clip list and its cap, the one progress bar, the Done text, and what a cancel hands
to the supervisor's cancel policy."""
from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from comfy_standin import run_node
from vllm_omni_launcher.client.batch import BatchCancelled, BatchResult, BatchUpdate, Clip
from vllm_omni_launcher.client.poll_window import Hint
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES, request_for
from vllm_omni_launcher.nodes import NODES, batch_session, session
from vllm_omni_launcher.nodes.batch_session import BatchProgress, clip_plan
from vllm_omni_launcher.nodes.handles import ServerHandle
from vllm_omni_launcher.server.logs.logwatch import fast_poll_hint

BATCH, GENERATE = NODES["VLLMOmniGenerateBatch"], NODES["VLLMOmniGenerateVideo"]


def test_batch_node_is_registered_with_list_videos_and_a_summary():
    assert BATCH.display_name == "vLLM-Omni Generate Batch"
    assert [o.kind for o in BATCH.outputs] == ["IMAGE", "FLOAT", "VIDEO", "STRING"]
    assert [o.is_list for o in BATCH.outputs] == [False, False, True, False]   # one VIDEO per clip, one IMAGE batch


def test_batch_inputs_are_generate_videos_with_prompts_and_batch_count():
    gen, batch = GENERATE.inputs(), {i.name: i for i in BATCH.inputs()}
    expected = [("prompts" if i.name == "prompt" else i.name) for i in gen]
    expected.insert(expected.index("seed") + 1, "batch_count")
    assert list(batch) == expected
    for spec in gen:
        if spec.name not in ("prompt", "interpolation_model"):
            assert batch[spec.name] == spec, spec.name                 # the same declaration, not a copy to drift
    assert batch["interpolation_model"].choices() == next(i for i in gen if i.name == "interpolation_model").choices()
    assert BATCH.hidden == GENERATE.hidden and batch["prompts"].opts["multiline"] and not batch["prompts"].optional
    count = batch["batch_count"]
    assert count.kind == "INT" and count.opts["min"] == 1 and count.default == 1 and not count.optional


def test_clip_plan_is_every_prompt_with_seeds_seed_to_seed_plus_count_minus_one():
    assert clip_plan("fox\ncat", seed=7, batch_count=3, limit=8) == [
        ("fox", 7), ("fox", 8), ("fox", 9), ("cat", 7), ("cat", 8), ("cat", 9)]
    assert clip_plan("fox", seed=2 ** 63 - 1, batch_count=2, limit=8) == [("fox", 2 ** 63 - 1), ("fox", 0)]


def test_clip_plan_refuses_no_prompt_and_more_clips_than_the_machine_allows():
    with pytest.raises(LauncherError) as info:
        clip_plan(" \n\n", seed=1, batch_count=2, limit=8)
    assert info.value.setting == "prompts"
    with pytest.raises(LauncherError) as info:
        clip_plan("a\nb\nc", seed=1, batch_count=3, limit=8)
    err = info.value
    assert "9 clips" in err.what and "allows 8" in err.what and err.setting == "batch_count"
    assert "max_batch_clips" in err.why and "max_batch_clips" in err.fix


def test_the_cap_comes_from_the_local_config_and_is_checked_before_anything_is_sent(tmp_path, monkeypatch):
    config = tmp_path / "launcher.json"
    config.write_text(json.dumps({"max_batch_clips": 2}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    contacted: list[Any] = []
    monkeypatch.setattr(batch_session.session, "job_client", lambda *a: contacted.append(a))
    handle = ServerHandle("remote", "http://127.0.0.1:9", "Wan-AI/Wan2.2-TI2V-5B-Diffusers", "ti2v_5b")
    with pytest.raises(LauncherError) as info:
        run_node("VLLMOmniGenerateBatch", handle, prompts="a fox\na cat", negative_prompt="", width=0, height=0, frames=0, fps=0.0,
                      steps=0, guidance=-1.0, guidance_2=-1.0, boundary_ratio=-1.0, flow_shift=-1.0, seed=1,
                      batch_count=2)
    assert "4 clips" in info.value.what and "allows 2" in info.value.what and not contacted


def test_the_cap_setting_is_validated_like_every_setting(tmp_path, monkeypatch):
    from vllm_omni_launcher.server.config.local_config import load_local_config

    config = tmp_path / "launcher.json"
    config.write_text(json.dumps({"max_batch_clips": 0}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    with pytest.raises(LauncherError) as info:
        load_local_config()
    assert info.value.setting == "max_batch_clips"


# --------------------------------------------------------------------------- progress
class Reporter:
    def __init__(self) -> None:
        self.bars: list[tuple[float, float]] = []
        self.texts: list[str] = []

    def bar(self, value: float, total: float) -> None:
        self.bars.append((value, total))

    def text(self, text: str) -> None:
        self.texts.append(text)


@dataclass
class Denoise:
    run_id: int
    step: int
    total: int
    done: bool = False

    def hint_after(self, run_floor: int) -> Hint:      # logwatch.DenoiseProgress's: no stored line here
        return Hint.DENOISED if self.run_id > run_floor and self.done else Hint.NONE


def test_one_bar_over_the_steps_of_all_clips_and_clip_k_of_n_in_the_text():
    reporter, current = Reporter(), [Denoise(3, 0, 10)]
    bar = BatchProgress(reporter, clips=3, steps=10, local_progress=lambda: current[0], run_floor=3)
    bar.on_update(BatchUpdate(("queued", "queued", "queued"), 1.0))            # an earlier job's run: 0
    current[0] = Denoise(4, 4, 10)
    bar.on_update(BatchUpdate(("in_progress", "queued", "queued"), 2.0))
    current[0] = Denoise(5, 6, 10)
    bar.on_update(BatchUpdate(("done", "in_progress", "queued"), 9.0))
    current[0] = Denoise(6, 2, 10)
    bar.on_update(BatchUpdate(("done", "done", "in_progress"), 14.0))
    bar.finish()
    assert reporter.bars == [(0, 30), (4, 30), (16, 30), (22, 30), (30, 30)]
    assert reporter.texts[0].startswith("Clip 1/3 queued")
    assert reporter.texts[1].startswith("Clip 1/3: step 4/10") and reporter.texts[2].startswith("Clip 2/3: step 6/10")
    assert reporter.texts[3].startswith("Clip 3/3: step 2/10")


def test_clips_in_progress_at_once_move_the_bar_and_are_called_in_progress_not_running_together():
    reporter = Reporter()
    bar = BatchProgress(reporter, clips=4, steps=10, local_progress=lambda: Denoise(2, 5, 10), run_floor=1)
    bar.on_update(BatchUpdate(("in_progress",) * 4, 3.0))
    assert reporter.bars == [(20, 40)]
    assert reporter.texts[0].startswith("Clips 1-4/4 in progress on the server: step 5/10")
    assert "together" not in reporter.texts[0]


def test_remote_bar_moves_clip_by_clip():
    reporter = Reporter()
    bar = BatchProgress(reporter, clips=2, steps=8)
    bar.on_update(BatchUpdate(("in_progress", "queued"), 1.0))
    bar.on_update(BatchUpdate(("done", "in_progress"), 5.0))
    assert reporter.bars == [(0, 16), (8, 16)] and reporter.texts[1].startswith("Clip 2/2: running")


class _Client:
    def __enter__(self) -> "_Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


@pytest.mark.parametrize("local", [True, False])
def test_the_job_loop_hints_fast_polls_once_a_local_run_of_these_jobs_reaches_its_last_step(local, monkeypatch):
    # session.run_jobs (Generate Video's and Generate Batch's loop): a supervised server's log gives the
    # client `due` (Supervisor.job_hint), DENOISED once a denoise run newer than any before these jobs is at
    # its last step; an earlier job's finished run is not these jobs'. A remote server gives none.
    log = [Denoise(4, 10, 10, True)]
    sup = SimpleNamespace(progress=lambda: log[0], job_hint=lambda: fast_poll_hint(lambda: log[0]),
                          mark_job_activity=lambda: None, spec=None, server_version=None) if local else None
    monkeypatch.setattr(session, "job_client", lambda handle, reporter, cfg, jobs: (_Client(), sup))
    seen: list[Any] = []

    def submit(client: Any, *, on_update: Any, should_cancel: Any, due: Any) -> str:
        for run in (Denoise(5, 3, 10), Denoise(5, 10, 10, True)):
            seen.append(due() if due is not None else None)
            log[0] = run
        seen.append(due() if due is not None else None)
        return "clips"

    reporter = Reporter()
    reporter.cancel_requested = lambda: False   # type: ignore[attr-defined]
    requests = [request_for(FAMILIES["ti2v_5b"], prompt="a cat", guidance=5.0)] * 2
    result = session.run_jobs(None, requests, reporter, "Submitting 2 jobs",
                              lambda progress, floor, client: BatchProgress(reporter, 2, 10, progress, floor),
                              submit, BatchCancelled, lambda *a: pytest.fail("not cancelled"))
    none, denoised = Hint.NONE, Hint.DENOISED
    assert result == "clips" and seen == ([none, none, denoised] if local else [None] * 3)


# --------------------------------------------------------------------------- the Done text
def _done_text(most_at_once: int) -> str:
    clips = [Clip(i, f"j{i}", b"", 9, 480, 832, 16.0, {}) for i in range(2)]
    result = BatchResult(frames=None, clips=clips, most_at_once=most_at_once, elapsed_s=12.0)   # type: ignore[arg-type]
    return batch_session._summary(result, [("a cat", 1), ("a cat", 2)], "")


def test_the_done_text_says_jobs_overlapped_without_claiming_batching_or_replicas():
    # what the polls measure: two jobs in_progress together, which one clip's MP4 encode beside the next
    # clip's denoise gives on a CFG-parallel server with no replica and no request batching
    done = _done_text(2).split("\n")[0]
    assert "up to 2 jobs were in progress on the server at once" in done
    assert "MP4 encode beside the next clip's denoise" in done and "does not mean the server batched" in done
    assert "ran up to" not in done
    assert _done_text(1).split("\n")[0].endswith("in 12.0s; the server ran them one after another")


# --------------------------------------------------------------------------- cancel
class Supervisor:
    def __init__(self) -> None:
        self.cancels: list[tuple[str, Optional[int], bool]] = []

    def cancel_job(self, job_id: str, run_floor: int = -1, queued: bool = False) -> Any:
        self.cancels.append((job_id, None if queued else run_floor, queued))
        return type("Decision", (), {"text": "Letting it drain: GPU free in ~3 s"})()


def test_a_local_cancel_hands_the_one_running_denoise_to_the_cancel_policy():
    sup = Supervisor()
    cancelled = BatchCancelled([("j2", "queued"), ("j3", "queued"), ("j1", "in_progress")], True, 1, 4)
    text = batch_session._cancel_text(cancelled, sup, run_floor=7)
    assert sup.cancels == [("j2", None, True), ("j3", None, True), ("j1", 7, False)]
    assert "deleted 3 job(s)" in text and "2 never reached the GPU" in text and "GPU free in ~3 s" in text


def test_a_batched_wave_is_weighed_once_and_a_remote_cancel_says_the_gpu_stays_busy():
    sup = Supervisor()
    batch_session._cancel_text(BatchCancelled([("a", "in_progress"), ("b", "in_progress")], True, 0, 2), sup, 3)
    assert sup.cancels == [("a", 3, False)]
    text = batch_session._cancel_text(BatchCancelled([("a", "in_progress")], False, 0, 1), None, -1)
    assert "did not confirm" in text and "cannot abort" in text
