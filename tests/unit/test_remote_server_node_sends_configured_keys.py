"""The node layer without a server: schemas and tooltips, caching keys, Load Model's list,
Remote Server's keys (a recording HTTP server of our own on 127.0.0.1), the reporter that
turns events into ComfyUI progress and text (ComfyUI stand-in), and request defaults.
"""
from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from comfy_standin import ComfyStandIn, run_node
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES, find_local_models, request_for
from vllm_omni_launcher.nodes import NODES, comfy_bridge, progress, session
from vllm_omni_launcher.nodes.handles import ServerHandle
from vllm_omni_launcher.server.config.remote_servers import USE_URL

TI2V_INDEX = {"_class_name": "WanPipeline", "expand_timesteps": True}
T2V_INDEX = {"_class_name": "WanPipeline"}
I2V_INDEX = {"_class_name": "WanImageToVideoPipeline"}


def _model_dir(path: Path, index: dict) -> Path:
    path.mkdir(parents=True)
    (path / "model_index.json").write_text(json.dumps(index))
    (path / "transformer").mkdir()
    return path


@pytest.fixture
def diffusers(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "models" / "diffusers"
    _model_dir(root / "Wan-AI" / "Wan2.2-TI2V-5B-Diffusers", TI2V_INDEX)   # huggingface-cli --local-dir layout
    _model_dir(root / "t2v", T2V_INDEX)
    _model_dir(root / "a" / "b" / "c" / "my-i2v-finetune", I2V_INDEX)
    _model_dir(root / "sdxl", {"_class_name": "StableDiffusionXLPipeline"})  # not Wan: not listed
    _model_dir(root / ".cache" / "hidden", TI2V_INDEX)                       # hidden folders are skipped
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)         # a link back up the tree
    monkeypatch.setattr(comfy_bridge, "diffusers_folders", lambda: [root])
    return root


# --------------------------------------------------------------------------- Load Model
def test_local_models_are_found_at_any_depth_labelled_by_relative_path(diffusers):
    found = find_local_models([diffusers])
    assert {label: m.family.key for label, m in found.items()} == {
        "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers": "ti2v_5b",
        "local/t2v": "t2v_a14b",
        "local/a/b/c/my-i2v-finetune": "i2v_a14b",
    }
    assert found["local/t2v"].path == diffusers / "t2v"


def test_load_model_offers_presets_and_local_labels_and_accepts_them(diffusers):
    node = NODES["VLLMOmniLoadModel"]
    options = node.inputs()[0].choices()
    assert options[:3] == [f.hf_id for f in FAMILIES.values()]
    assert "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers" in options
    assert not any(str(diffusers) in o or o.startswith("/") for o in options), "no absolute path in the list"
    assert node.validate({"model": "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers"}) is True     # checked at /prompt
    assert "not one of Load Model's choices" in node.validate({"model": "local/missing"})
    choice = run_node("VLLMOmniLoadModel", "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers")[0]
    assert choice.model == str(diffusers / "Wan-AI" / "Wan2.2-TI2V-5B-Diffusers") and choice.family_key == "ti2v_5b"
    assert choice.label == "local/Wan-AI/Wan2.2-TI2V-5B-Diffusers"
    preset = run_node("VLLMOmniLoadModel", "Wan-AI/Wan2.2-I2V-A14B-Diffusers")[0]
    assert (preset.model, preset.family_key) == ("Wan-AI/Wan2.2-I2V-A14B-Diffusers", "i2v_a14b")


def test_load_model_refuses_anything_else_with_one_message_whether_or_not_it_exists(diffusers, tmp_path):
    existing = str(diffusers / "t2v")               # a real Wan folder, given as a path
    tries = [existing, str(tmp_path / "does-not-exist"), "~/../../x", "local/missing", "local/../t2v",
             "local/sdxl", "wan-ai/wan2.2-ti2v-5b-diffusers "]
    errors = []
    for name in tries:
        with pytest.raises(LauncherError) as err:
            run_node("VLLMOmniLoadModel", name)
        errors.append(err.value)
    assert {(e.why, e.fix, e.setting) for e in errors} == {(errors[0].why, errors[0].fix, "model")}
    assert all(e.what == f"Model '{name}' is not one of Load Model's choices on this machine"
               for e, name in zip(errors, tries))


# --------------------------------------------------------------------------- caching keys
def test_caching_keys_keep_an_unchanged_graph_cached():
    # ComfyUI folds each upstream fingerprint_inputs into the downstream cache key: NaN (!= itself)
    # upstream of Generate Video would re-run the job on every queue.
    assert [n for n in NODES.values() if n.fingerprint is not None and not n.output_node] == [NODES[
        "VLLMOmniRemoteServer"]]                                        # Local Server and the rest: inputs only
    remote = NODES["VLLMOmniRemoteServer"].fingerprint
    first = remote(url="http://127.0.0.1:8091", model_family="ti2v_5b", remote_server=USE_URL)
    assert first == "http://127.0.0.1:8091"                             # stable, and not NaN
    assert remote(url="http://127.0.0.1:8091", model_family="ti2v_5b", remote_server=USE_URL) == first
    assert remote(url="http://127.0.0.1:9999", model_family="ti2v_5b") != first
    for node_id in ("VLLMOmniStopServer", "VLLMOmniServerStatus", "VLLMOmniDoctor"):
        node = NODES[node_id]
        assert node.output_node and math.isnan(node.fingerprint())     # report nodes act on every queue
        assert [o.kind for o in node.outputs] == ["STRING"]             # nothing expensive downstream


def test_remote_identity_follows_the_configured_url_of_a_named_server(tmp_path, monkeypatch):
    config = tmp_path / "launcher.json"
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    config.write_text(json.dumps({"remote_servers": {"box": {"url": "http://127.0.0.1:8091"}}}))
    remote = NODES["VLLMOmniRemoteServer"].fingerprint
    before = remote(url="ignored", model_family="ti2v_5b", remote_server="box")
    assert before == remote(url="also ignored", model_family="ti2v_5b", remote_server="box")
    config.write_text(json.dumps({"remote_servers": {"box": {"url": "http://127.0.0.1:8092"}}}))
    assert remote(url="ignored", model_family="ti2v_5b", remote_server="box") != before
    config.write_text("{not json")
    assert remote(url="x", model_family="ti2v_5b", remote_server="box") == "box="   # never raises


# --------------------------------------------------------------------------- schemas
def test_every_input_and_output_has_a_tooltip_and_every_node_a_description():
    for node_id, node in NODES.items():
        assert node.description, node_id
        for spec in node.inputs():
            tip = spec.tooltip
            assert tip, f"{node_id}.{spec.name} has no tooltip"
            if "min" in spec.opts and "recommended" in tip:
                marker = "-1 =" if spec.opts["min"] < 0 else "0 ="
                assert marker in tip and ("0 or -1" not in tip), f"{node_id}.{spec.name}: {tip}"
        assert node.outputs and all(o.tooltip for o in node.outputs), node_id


def test_report_nodes_take_the_node_id_to_show_their_text():
    for node_id in ("VLLMOmniStopServer", "VLLMOmniServerStatus", "VLLMOmniDoctor", "VLLMOmniLocalServer",
                    "VLLMOmniRemoteServer", "VLLMOmniGenerateVideo"):
        assert "unique_id" in NODES[node_id].hidden


def test_status_and_stop_text_reaches_the_node_the_output_and_the_history():
    with ComfyStandIn() as comfy:
        out = run_node("VLLMOmniServerStatus", unique_id="7")
        stop = run_node("VLLMOmniStopServer", stop_all=False, unique_id="8")
    assert out == ("No launcher-started server is running.",) and NODES["VLLMOmniServerStatus"].shows_text
    assert stop == ("No launcher-started server was running.",) and NODES["VLLMOmniStopServer"].shows_text
    assert comfy.texts == [(out[0], "7"), (stop[0], "8")]     # send_progress_text


# --------------------------------------------------------------------------- Remote Server keys
class _RecordingServer:
    """A vLLM-Omni look-alike that wants key 'k' and records every Authorization header."""

    def __init__(self) -> None:
        self.auth: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.auth.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") == "Bearer k":
                    code, body = 200, {"data": [{"id": "Wan-AI/Wan2.2-TI2V-5B-Diffusers"}]}
                else:
                    code, body = 401, {"error": {"message": "Unauthorized", "code": 401}}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recording(tmp_path, monkeypatch):
    server = _RecordingServer()
    config = tmp_path / "launcher.json"
    config.write_text(json.dumps({"remote_servers": {
        "box": {"url": f"http://127.0.0.1:{server.port}", "api_key": "k"}}}))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    yield server
    server.close()


def test_remote_server_offers_configured_servers_and_sends_their_key(recording):
    remote_server = NODES["VLLMOmniRemoteServer"].inputs()[-1]
    assert remote_server.name == "remote_server" and remote_server.choices() == [USE_URL, "box"]
    with ComfyStandIn() as comfy:
        handle = run_node("VLLMOmniRemoteServer", "http://ignored.invalid", "ti2v_5b", "box", unique_id="2")[0]
    assert recording.auth == ["Bearer k"]
    assert (handle.url, handle.remote_name, handle.served_name) == (
        f"http://127.0.0.1:{recording.port}", "box", "Wan-AI/Wan2.2-TI2V-5B-Diffusers")
    assert "k" not in repr(handle).replace("kind", "") and "api_key" not in repr(handle)
    assert comfy.texts[0] == ("Connecting", "2") and comfy.texts[-1][0].startswith("Connected: ")


def test_a_typed_url_gets_the_key_only_when_its_origin_is_configured(recording):
    run_node("VLLMOmniRemoteServer", f"http://127.0.0.1:{recording.port}/v1", "ti2v_5b")       # the configured origin (path ignored)
    assert recording.auth == ["Bearer k"]
    with pytest.raises(LauncherError) as err:                              # same server, another origin
        run_node("VLLMOmniRemoteServer", f"http://localhost:{recording.port}", "ti2v_5b")
    assert recording.auth[1:] and all(a is None for a in recording.auth[1:]), "the key went to an unnamed origin"
    assert "requires an API key" in err.value.what


def test_an_unknown_configured_name_and_a_bad_url_name_the_widget(recording):
    with pytest.raises(LauncherError) as err:
        run_node("VLLMOmniRemoteServer", "http://127.0.0.1:1", "ti2v_5b", "gpu-box")
    assert err.value.setting == "remote_server" and "remote_servers" in err.value.fix
    with pytest.raises(LauncherError) as err:
        run_node("VLLMOmniRemoteServer", "ftp://127.0.0.1:1", "ti2v_5b")
    assert err.value.setting == "url"
    assert recording.auth == []


# --------------------------------------------------------------------------- the reporter
def test_reporter_sends_text_and_bar_only_when_they_change():
    with ComfyStandIn() as comfy:
        reporter = progress.NodeReporter("5")
        for _ in range(3):
            reporter.text("Step 1/3")
            reporter.bar(1, 3)
        reporter.text("Step 2/3")
        reporter.bar(2, 3)
        reporter.text("")                    # the front end ignores empty text: something is always shown
    assert comfy.texts == [("Step 1/3", "5"), ("Step 2/3", "5"), ("…", "5")]
    assert comfy.progress == [(1, 3), (2, 3)]


def test_reporter_sees_a_pending_cancel_and_never_clears_it_while_the_bar_moves():
    with ComfyStandIn() as comfy:
        reporter = progress.NodeReporter("5")
        assert not reporter.cancel_requested()
        comfy.interrupt.set()
        reporter.bar(1, 10)                  # the V3 progress API never consumes ComfyUI's Cancel
        assert comfy.interrupt.is_set() and reporter.cancel_requested() and comfy.progress == [(1, 10)]
        reporter.close()
        reporter.bar(2, 10)                  # the node has returned: no more bar
    assert comfy.progress == [(1, 10)]


def test_a_run_replaces_the_last_text_and_a_failure_says_what_went_wrong():
    with ComfyStandIn() as comfy:
        with pytest.raises(LauncherError):
            with progress.reporting("9", "Checking the request") as reporter:
                reporter.text("Done: earlier run")
                raise LauncherError("frames 10 is not valid for Wan2.2", "4k+1", "set frames to 9")
        reporter.bar(1, 2)                   # after the node returned: no bar from late callbacks
    assert [t for t, _ in comfy.texts] == ["Checking the request", "Done: earlier run",
                                           "Failed: frames 10 is not valid for Wan2.2"]
    assert comfy.progress == []


def test_launch_status_shows_the_phase_progress_on_the_bar_and_in_the_text():
    class St:
        text, progress, fallback_note = "Downloading the model", (1200.0, 23000.0, "MB"), None

    with ComfyStandIn() as comfy:
        reporter = progress.NodeReporter("3")
        reporter.launch_status(St())
    assert comfy.texts == [("Downloading the model (1,200/23,000 MB)", "3")]
    assert comfy.progress == [(1200, 23000)]


# --------------------------------------------------------------------------- remote progress
class _Update:
    def __init__(self, running_s: float) -> None:
        self.status, self.queued_s, self.running_s, self.job_id = "in_progress", 0.0, running_s, "j"


def test_remote_progress_shows_elapsed_time_and_grows_past_the_estimate():
    with ComfyStandIn() as first_comfy:
        first = progress.JobProgress(progress.NodeReporter("1"), steps=40)
        first.on_update(_Update(12.4))
    assert first_comfy.texts[0] == ("Running 12s (first job of this size on this server: no estimate yet, so the "
                                    "bar shows time elapsed)", "1")
    assert 0 < first_comfy.progress[-1][0] < progress.REMOTE_BAR      # a bar on the first job too
    with ComfyStandIn() as comfy:
        tracker = progress.JobProgress(progress.NodeReporter("2"), steps=40, remote_estimate_s=20.0)
        for t in range(0, 61, 2):
            tracker.on_update(_Update(float(t)))
    texts = [t for t, node in comfy.texts if node == "2"]
    assert "Running 10s, ~10s left (estimated from earlier jobs on this server)" in texts
    assert not any("~0s left" in t for t in texts)
    assert texts[-1] == "Running 1:00: longer than the ~20s earlier jobs took here, so no time left can be estimated"
    bar = [value for value, _ in comfy.progress]
    assert bar == sorted(bar) and bar[-1] < progress.REMOTE_BAR and bar[-1] > bar[len(bar) // 2]


# --------------------------------------------------------------------------- requests
def test_request_for_fills_the_models_values_where_asked_and_keeps_real_zeros():
    t2v = FAMILIES["t2v_a14b"]
    req = request_for(t2v, prompt="a fox", width=0, height=0, frames=0, fps=0, steps=0, guidance=-1,
                      guidance_2=-1, boundary_ratio=-1, flow_shift=-1, seed=3, negative_prompt="")
    assert (req.width, req.height, req.num_frames, req.fps, req.steps) == (832, 480, 81, 16.0, 40)
    assert (req.guidance, req.guidance_2, req.boundary_ratio, req.flow_shift) == (4.0, 3.0, 0.875, 12.0)
    assert req.negative_prompt is None and req.seed == 3
    assert request_for(t2v, prompt="a fox") == request_for(t2v, prompt="a fox", frames=None)   # CLI: None
    ti2v = request_for(FAMILIES["ti2v_5b"], prompt="x", guidance=0.0, guidance_2=7.0, boundary_ratio=0.5)
    assert ti2v.guidance == 0.0 and ti2v.guidance_2 is None and ti2v.boundary_ratio is None   # one expert
    with pytest.raises(LauncherError) as err:
        request_for(t2v, prompt="  ")
    assert err.value.setting == "prompt"
    with pytest.raises(LauncherError) as err:
        request_for(FAMILIES["i2v_a14b"], prompt="x")
    assert err.value.setting == "image"


def test_a_plan_limit_applies_only_where_generate_asks_for_the_models_value():
    from vllm_omni_launcher.nodes.handles import RequestLimit

    limit = RequestLimit(1280, 704, 113, "the serving plan fits 1280x704x113, not the model's 1280x704x121")
    widgets, note = limit.apply({"width": 0, "height": 0, "frames": 0, "seed": 1})   # what build_request applies
    assert (widgets["width"], widgets["height"], widgets["frames"]) == (1280, 704, 113)
    assert note.startswith("width, height, frames from the serving plan")
    kept, note = limit.apply({"width": 640, "height": 0, "frames": 81})
    assert kept == {"width": 640, "height": 0, "frames": 81} and note == ""


def test_handles_carry_no_process_and_are_equal_for_the_same_server():
    a = ServerHandle("remote", "http://127.0.0.1:1", "wan", "ti2v_5b")
    b = ServerHandle("remote", "http://127.0.0.1:1", "wan", "ti2v_5b")       # another object, same server
    assert a is not b and a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != ServerHandle("remote", "http://127.0.0.1:2", "wan", "ti2v_5b"), "another server"
    assert "generation" not in repr(a)


@pytest.mark.parametrize("mode, guidance, guidance_2, warned", [
    ("cfg", 1.0, 1.0, True),          # distill settings on a CFG-parallel server: one GPU idles
    ("cfg", 4.0, 3.0, False),         # real CFG: both GPUs work
    ("cfg", None, None, False),       # the server's default guidance is not known to be 1
    ("ulysses", 1.0, 1.0, False),     # no CFG parallel, nothing idles
])
def test_generate_notes_an_idle_gpu_when_cfg_parallel_meets_guidance_1(monkeypatch, mode, guidance, guidance_2,
                                                                       warned):
    from types import SimpleNamespace

    from vllm_omni_launcher.server.launch.spec import LaunchSpec, ParallelConfig

    spec = LaunchSpec(model=FAMILIES["t2v_a14b"].hf_id, parallel=ParallelConfig(mode=mode, degree=2))
    monkeypatch.setattr(session.registry, "find", lambda server_id: SimpleNamespace(spec=spec))
    handle = ServerHandle("local", "http://127.0.0.1:1", spec.model, "t2v_a14b", server_id=spec.fingerprint())
    request = SimpleNamespace(guidance=guidance, guidance_2=guidance_2)
    note = session._idle_cfg_note(handle, request)
    assert (("CFG parallel does nothing at guidance 1" in note and "parallel_mode to ulysses" in note)
            if warned else note == "")
