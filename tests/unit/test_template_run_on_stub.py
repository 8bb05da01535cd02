"""One shipped template run for real: the TI2V text-to-video API twin through a small stand-in of
ComfyUI's executor (validate, order, call, collect UI outputs) against the stub vLLM-Omni server, our
nodes real and the core LoadImage / SaveVideo stand-ins with the same inputs and outputs (ComfyUI is not
installed in CI); the other templates are checked structurally (test_workflows.py).
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

import frame_code
import stubserver
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from workflow_defs import NodeDef, api_input_problems, api_path, load, node_defs

defs_fixture = pytest.fixture(scope="module", name="defs")(node_defs)


class StandInExecutor:
    """The part of ComfyUI's executor an API prompt needs: validate, order, call, collect UI outputs.

    Our nodes run for real; core LoadImage and SaveVideo are small stand-ins with the same
    inputs and outputs (ComfyUI itself is not installed in CI).
    """

    def __init__(self, defs: dict[str, NodeDef], input_dir: Path, output_dir: Path) -> None:
        self.defs, self.input_dir, self.output_dir = defs, input_dir, output_dir
        self.outputs: dict[str, tuple] = {}
        self.ui: dict[str, dict] = {}
        self.order: list[str] = []

    def validate(self, prompt: dict) -> None:
        problems = []
        for node_id, entry in prompt.items():
            nd = self.defs[entry["class_type"]]
            problems += [f"{node_id}: {p}" for p in api_input_problems(nd, entry["inputs"])]
            for name, value in entry["inputs"].items():
                if isinstance(value, list):
                    src = self.defs[prompt[value[0]]["class_type"]]
                    if src.outputs[value[1]] != nd.input_spec(name)[0]:
                        problems.append(f"{node_id}.{name}: {src.outputs[value[1]]} linked to {nd.input_spec(name)[0]}")
            if nd.cls is not None:            # V3 validate_inputs: our literal combo values
                result = nd.cls.validate({k: v for k, v in entry["inputs"].items() if not isinstance(v, list)})
                if result is not True:
                    problems.append(f"{node_id}: {result}")
        assert not problems, "prompt validation failed:\n" + "\n".join(problems)

    def topological(self, prompt: dict) -> list[str]:
        order, done = [], set()

        def visit(node_id: str, path: tuple) -> None:
            assert node_id not in path, f"cycle through {node_id}"
            if node_id in done:
                return
            for value in prompt[node_id]["inputs"].values():
                if isinstance(value, list):
                    visit(value[0], path + (node_id,))
            done.add(node_id)
            order.append(node_id)

        for node_id in sorted(prompt, key=int):
            visit(node_id, ())
        return order

    def run(self, prompt: dict) -> None:
        self.validate(prompt)
        self.order = self.topological(prompt)
        for node_id in self.order:
            entry = prompt[node_id]
            kwargs = {k: (self.outputs[v[0]][v[1]] if isinstance(v, list) else v) for k, v in entry["inputs"].items()}
            nd = self.defs[entry["class_type"]]
            if nd.cls is None:
                result = getattr(self, "core_" + entry["class_type"])(**kwargs)
            else:
                result = nd.cls.call(kwargs, {"unique_id": node_id})      # what V3 execute does
            if isinstance(result, dict):
                self.ui[node_id] = result.get("ui", {})
                result = tuple(result.get("result", ()))
            assert isinstance(result, tuple) and len(result) == len(nd.outputs), (node_id, result)
            self.outputs[node_id] = result

    def core_LoadImage(self, image: str) -> dict:  # noqa: N802
        import torch
        from PIL import Image

        with Image.open(self.input_dir / image) as im:
            array = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
        tensor = torch.from_numpy(array)[None]
        return {"result": (tensor, torch.zeros(tensor.shape[:3]))}

    def core_SaveVideo(self, video: Any, filename_prefix: str, format: str, codec: str) -> dict:  # noqa: A002, N802
        subfolder, _, prefix = filename_prefix.rpartition("/")
        folder = self.output_dir / subfolder
        folder.mkdir(parents=True, exist_ok=True)
        filename = f"{prefix}_00001_.mp4"
        video.save_to(str(folder / filename), format=format, codec=codec)
        return {"ui": {"images": [{"filename": filename, "subfolder": subfolder, "type": "output"}],
                       "animated": [True]}, "result": ()}


TINY = {"width": 64, "height": 64, "frames": 5, "steps": 2}   # TI2V-5B: sizes x32, frames 4k+1


def test_ti2v_text_to_video_template_runs_end_to_end_on_the_stub_server(defs, server_env_python, tmp_path,
                                                                         monkeypatch):
    from vllm_omni_launcher.server import registry

    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_SERVER_CMD", shlex.join([server_env_python, stubserver.STUB_SCRIPT]))
    monkeypatch.setenv(GPU_MEMORY_ENV, "24")        # the GPU the template's Note asks for
    monkeypatch.setenv("VLLM_OMNI_STUB_STEP_S", "0.02")
    prompt = load(api_path("wan22_ti2v_5b_text_to_video"))
    gen_id = next(k for k, e in prompt.items() if e["class_type"] == "VLLMOmniGenerateVideo")
    prompt[gen_id]["inputs"].update(TINY)
    seed = prompt[gen_id]["inputs"]["seed"]
    executor = StandInExecutor(defs, tmp_path / "input", tmp_path / "output")
    try:
        executor.run(prompt)
        server_id = next(k for k, e in prompt.items() if e["class_type"] == "VLLMOmniLocalServer")
        handle = executor.outputs[server_id][0]
        assert handle.kind == "local" and handle.family_key == "ti2v_5b"
    finally:
        registry.stop_all()
    assert [prompt[i]["class_type"] for i in executor.order] == [
        "VLLMOmniLoadModel", "VLLMOmniServingConfig", "VLLMOmniLocalServer", "VLLMOmniGenerateVideo", "SaveVideo"]
    frames, fps, _ = executor.outputs[gen_id]
    assert tuple(frames.shape) == (5, 64, 64, 3) and str(frames.dtype) == "torch.float32"
    assert fps == FAMILIES["ti2v_5b"].fps                    # fps 0 in the template: the model's 24
    save_id = next(k for k, e in prompt.items() if e["class_type"] == "SaveVideo")
    saved = executor.ui[save_id]["images"][0]
    path = tmp_path / "output" / saved["subfolder"] / saved["filename"]
    assert saved["subfolder"] == "video" and path.stat().st_size > 0
    with av.open(str(path)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == 5 and decoded[0].shape == (64, 64, 3)
    # the stub paints frame index and seed into each frame: this file is our request's output
    assert [frame_code.decode(f.astype(np.float32) / 255.0) for f in decoded] == [(i, seed % 256) for i in range(5)]


def test_stand_in_executor_refuses_an_invalid_prompt_like_comfyui(defs, tmp_path):
    prompt = load(api_path("wan22_ti2v_5b_text_to_video"))
    gen_id = next(k for k, e in prompt.items() if e["class_type"] == "VLLMOmniGenerateVideo")
    prompt[gen_id]["inputs"]["steps"] = 999                  # over the widget's max
    del prompt[gen_id]["inputs"]["prompt"]
    with pytest.raises(AssertionError, match=r"steps: 999 > max 200(.|\n)*required input prompt is missing"):
        StandInExecutor(defs, tmp_path, tmp_path).validate(prompt)

