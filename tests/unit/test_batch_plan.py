"""Local Server plans for the Generate Batch nodes it feeds: their job count (prompt lines x
batch_count, read from the queued prompt before any job exists) reaches the planner, so an `auto`
server on several GPUs fed by a batch of two or more clips suggests replicas where one card fits.
A batch that starts a stopped local server again plans it for the batch, as Local Server does."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contract"))
from comfy_standin import ComfyStandIn, run_node  # noqa: E402
from queued_prompts import JOB, batch_node, queued_prompt, video_node  # noqa: E402

from vllm_omni_launcher.errors import LauncherError  # noqa: E402

from vllm_omni_launcher.nodes.handles import ServerHandle, ServingChoice  # noqa: E402
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV, resolve_launch  # noqa: E402
from vllm_omni_launcher.planner.queued_prompt import queued_jobs  # noqa: E402
from vllm_omni_launcher.server.config.local_config import LocalConfig  # noqa: E402

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def test_a_batch_fed_auto_server_on_two_cards_shows_the_replica_suggestion(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(tmp_path / "none.json"))
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    config, choice = LocalConfig(), ServingChoice()

    def plan_text(prompt: dict) -> str:
        return resolve_launch(choice.base_spec(TI2V, config), config, gpus=choice.gpus, auto=True,
                              server_version=(0, 30), queued_jobs=queued_jobs(prompt, "3")).text

    text = plan_text(queued_prompt(**{"10": batch_node("a fox\na cat", 2)}))
    assert "4 jobs are queued and the model fits one GPU: replicas 2" in text
    assert "set replicas to 2 on Serving Config" in text
    assert "jobs are queued" not in plan_text(queued_prompt(**{"10": batch_node("a fox", 1), "11": video_node()}))


def test_the_local_server_node_shows_the_suggestion_for_the_batch_it_feeds(monkeypatch, tmp_path):
    """The Local Server node itself, through ComfyUI's stand-in: its text shows the plan before the
    launch. The server program does not exist here, so the launch then fails (a fault, as on a
    machine without the server environment) and nothing starts."""
    config = tmp_path / "vllm_omni_launcher.json"
    # a batch of 6 TI2V clips (7.3 GiB of frames) must pass the batch's memory check on a small CI box
    config.write_text(json.dumps({"server_command": [str(tmp_path / "no-such-serve")],
                                  "data_dir": str(tmp_path / "data"), "max_clip_memory_gib": 16}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")
    model = run_node("VLLMOmniLoadModel", TI2V)[0]
    serving = ServingChoice()
    with ComfyStandIn() as comfy, pytest.raises(LauncherError):
        run_node("VLLMOmniLocalServer", model, serving, unique_id="3",
                                                           prompt=queued_prompt(**{"10": batch_node("a\nb\nc", 2)}))
    texts = [text for text, node in comfy.texts if node == "3"]
    assert any("6 jobs are queued and the model fits one GPU: replicas 2" in t for t in texts), texts


# ---- a restart from Generate Batch plans for the batch ---------------------------------------------------
@pytest.fixture
def no_server(monkeypatch, tmp_path):
    config = tmp_path / "vllm_omni_launcher.json"
    # a batch of 6 TI2V clips (7.3 GiB of frames) must pass the batch's memory check on a small CI box
    config.write_text(json.dumps({"server_command": [str(tmp_path / "no-such-serve")],
                                  "data_dir": str(tmp_path / "data"), "max_clip_memory_gib": 16}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    monkeypatch.setenv(GPU_MEMORY_ENV, "80,80")


def _plan_texts(comfy: ComfyStandIn, node: str) -> list[str]:
    return [text for text, at in comfy.texts if at == node and "jobs are queued" in text]


def test_a_batch_that_starts_a_stopped_server_plans_it_for_its_clips_as_local_server_does(no_server):
    model = run_node("VLLMOmniLoadModel", TI2V)[0]
    serving = ServingChoice()
    with ComfyStandIn() as comfy:
        with pytest.raises(LauncherError):               # Local Server, for a queued batch of 3 lines x 2
            run_node("VLLMOmniLocalServer", model, serving, unique_id="3",
                                                               prompt=queued_prompt(**{"10": batch_node("a\nb\nc", 2)}))
        # the server is not running (stopped, idle or crashed): Generate Batch starts it again
        handle = ServerHandle("local", "", TI2V, model.family_key, server_id="stopped", model=model,
                              serving=serving)
        with pytest.raises(LauncherError):
            run_node("VLLMOmniGenerateBatch", handle, prompts="a\nb\nc", batch_count=2,
                                                                    unique_id="10", **JOB)
    at_start, at_restart = _plan_texts(comfy, "3"), _plan_texts(comfy, "10")
    assert at_restart and at_restart == at_start, comfy.texts
    assert "6 jobs are queued and the model fits one GPU: replicas 2" in at_restart[0]


def test_a_single_job_that_starts_a_stopped_server_gets_no_batch_advice(no_server):
    model = run_node("VLLMOmniLoadModel", TI2V)[0]
    handle = ServerHandle("local", "", TI2V, model.family_key, server_id="stopped", model=model,
                          serving=ServingChoice())
    with ComfyStandIn() as comfy, pytest.raises(LauncherError):
        run_node("VLLMOmniGenerateVideo", handle, prompt="a cat", unique_id="11", **JOB)
    assert any(at == "11" and "starting it again" in text for text, at in comfy.texts), comfy.texts
    assert _plan_texts(comfy, "11") == []
