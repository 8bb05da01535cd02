"""The pure parts of the GPU bench driver (`python -m bench.gpu`): the two graphs the head-to-head queues,
how it times nodes and sampler steps from ComfyUI's websocket, the server's own timing lines, the weight
manifests' consistency and layout rules, the calibration's job order, cap plan and planner points.
The device phases themselves are rehearsed on CPU (real ComfyUI --cpu + the stub server): see
bench/results/h200-native-vs-ours-vllm-omni-0.30/README.md, "Rehearsal"."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
try:
    from bench.gpu import calibrate, common, native, report, weights
finally:
    sys.path.remove(str(REPO))      # the repo root holds top-level names (server, nodes) ComfyUI also uses

MANIFEST = json.loads(weights.MANIFEST.read_text())
REQUEST = {"prompt": "p", "negative": "n", "width": 1280, "height": 704, "frames": 121, "fps": 24, "steps": 4,
           "seed": 42}


def test_native_graph_is_comfyuis_5b_template_ending_in_the_sink():
    g = native.native_prompt(REQUEST)
    kinds = {k: e["class_type"] for k, e in g.items()}
    assert {"UNETLoader", "CLIPLoader", "VAELoader", "ModelSamplingSD3", "CLIPTextEncode", "Wan22ImageToVideoLatent",
            "KSampler", "VAEDecode", "GetImageSize", "PreviewAny"} == set(kinds.values())
    ks = g[native.KSAMPLER]["inputs"]
    assert (ks["sampler_name"], ks["scheduler"], ks["cfg"], ks["steps"], ks["seed"]) == ("uni_pc", "simple", 5.0, 4, 42)
    assert g["48"]["inputs"]["shift"] == 8.0 and g["38"]["inputs"]["type"] == "wan"
    latent = g["55"]["inputs"]
    assert (latent["width"], latent["height"], latent["length"]) == (1280, 704, 121)
    assert g["90"]["inputs"]["image"] == [native.DECODE, 0]        # the IMAGE, nothing encoded or saved
    names = {g["37"]["inputs"]["unet_name"], g["38"]["inputs"]["clip_name"], g["39"]["inputs"]["vae_name"]}
    assert names == {name for _, name in weights.COMFY_FILES.values()}


def test_our_graph_sends_the_same_request_and_drops_the_save_node():
    template = json.loads((REPO / "workflows/api/wan22_ti2v_5b_text_to_video.api.json").read_text())
    g = native.ours_prompt(template, "local/ti2v-5b-fullsize", REQUEST)
    gen = next(e["inputs"] for e in g.values() if e["class_type"] == "VLLMOmniGenerateVideo")
    assert (gen["width"], gen["height"], gen["frames"], gen["steps"], gen["seed"]) == (1280, 704, 121, 4, 42)
    assert (gen["guidance"], gen["flow_shift"], gen["sampler"]) == (5.0, 8.0, "unipc")
    assert not any(e["class_type"] in ("SaveVideo", "SaveImage") for e in g.values())
    gen_id = next(k for k, e in g.items() if e["class_type"] == "VLLMOmniGenerateVideo")
    assert g["90"]["inputs"]["image"] == [gen_id, 0]


def _ev(t, kind, **data):
    return {"t": t, "type": kind, "data": dict(data, prompt_id="p1")}


def test_node_and_step_times_come_from_websocket_order():
    events = [_ev(0.0, "executing", node="37"), _ev(2.0, "executing", node="3"),
              _ev(5.0, "progress", node="3", value=1, max=3), _ev(7.0, "progress", node="3", value=2, max=3),
              _ev(9.0, "progress", node="3", value=3, max=3), _ev(9.5, "executing", node="8"),
              _ev(12.0, "executing", node=None), _ev(1.0, "executing", node="x", prompt_id="other")]
    events[-1]["data"]["prompt_id"] = "other"
    assert native.node_times(events, "p1") == {"37": 2.0, "3": 7.5, "8": 2.5}
    assert native.sampler_steps(events, "p1", "3") == {"steps_seen": 3, "to_first_step_s": 3.0, "s_per_step": 2.0}


def test_server_timing_lines_of_vllm_omni_0_30_parse():
    line = (   # as vllm-omni 0.30 logged them on the H200 (DEBUG_PERF on)
            "(DiffusionWorker pid=2252) INFO 12-02 14:01:40 [pipeline_wan2_2.py:1019] Pipeline stage timing summary: "
            "TextEncoding=127.09 ms, LatentPreparation=0.15 ms, Denoising=7052.28 ms (4 steps), Decoding=3981.55 ms, "
            "StagesSum=11161.07 ms, PipelineWall=11161.54 ms, Unaccounted=0.47 ms\n"
            "INFO [serving_video.py:627] Video response encoding (MP4 bytes): 789.45 ms\n"
            "\r 50%|#####     | 2/4 [00:03<00:03,  1.76s/it]")
    assert common.stage_timings(line) == [pytest.approx(
        {"text_encode_s": 0.12709, "latent_prep_s": 0.00015, "denoise_s": 7.05228, "steps": 4, "vae_decode_s": 3.98155,
         "pipeline_s": 11.16154})]
    assert common.mp4_encode_s(line) == [pytest.approx(0.78945)] and common.last_step_rate(line) == 1.76


def test_generate_videos_job_lines_in_comfyuis_log_give_each_jobs_server_and_ready_times():
    log = ("got prompt\nvLLM-Omni job done: 121 frames 1280x704 at 24 fps; the server's own time 13.273 s, frames "
           "ready 13.499 s after submit\nPrompt executed in 14.02 seconds\ngot prompt\nvLLM-Omni job done: 81 frames "
           "832x480 at 16 fps; the server gave no time, frames ready 40.125 s after submit\n")
    assert native.job_done_times(log) == [{"server_inference_s": 13.273, "frames_ready_s": 13.499},
                                          {"server_inference_s": None, "frames_ready_s": 40.125}]
    assert native.job_done_times("got prompt\nPrompt executed in 14.02 seconds\n") == []   # an older pack: no line


def test_manifest_sides_match_the_planner_sizes_and_share_one_text_encoder():
    weights.check_shared_text_encoder(MANIFEST)
    params = {name: sum(math.prod(s) for _, s, _ in (v["tensors"] if isinstance(v, dict) else v)) / 1e9
              for side in ("diffusers", "comfy") for name, v in MANIFEST[side].items() if name != "files"}
    assert params["transformer"] == pytest.approx(params["unet"]) == pytest.approx(5.0, abs=0.01)
    assert params["text_encoder"] == pytest.approx(params["te"]) == pytest.approx(5.68, abs=0.01)
    assert params["vae"] == pytest.approx(0.705, abs=0.001)
    broken = json.loads(json.dumps(MANIFEST))
    broken["comfy"]["te"][0][1] = [1, 1]
    with pytest.raises(ValueError, match="UMT5 tensors differ"):
        weights.check_shared_text_encoder(broken)


def test_random_fill_keeps_norms_at_one_biases_at_zero_and_scales_the_rest():
    assert weights.init_kind("blocks.0.norm_q.weight", [3072]) == ("ones", 0.0)
    assert weights.init_kind("encoder.block.0.layer.0.layer_norm.weight", [4096]) == ("ones", 0.0)
    assert weights.init_kind("decoder.middle.0.residual.0.gamma", [256, 1, 1, 1]) == ("ones", 0.0)
    assert weights.init_kind("blocks.0.ffn.0.bias", [14336]) == ("zeros", 0.0)
    assert weights.init_kind("blocks.0.ffn.0.weight", [14336, 3072]) == ("normal", pytest.approx(3072 ** -0.5))
    assert weights.init_kind("blocks.0.modulation", [1, 6, 3072]) == ("normal", pytest.approx(3072 ** -0.5))


def test_shards_stay_under_the_limit_and_keep_order():
    tensors = [["a", [10], "bf16"], ["b", [30], "bf16"], ["c", [100], "fp32"], ["d", [5], "bf16"]]
    groups = weights.shard(tensors, limit=100)
    assert [[t[0] for t in g] for g in groups] == [["a", "b"], ["c"], ["d"]]
    assert all(weights.nbytes(g) <= 100 for g in groups if len(g) > 1)


def test_calibration_orders_shapes_by_tokens_and_reads_the_cap_plan():
    assert calibrate.parse_shapes("1280x704x121,832x480x81,1024x576x97,832x480x49") == [
        (832, 480, 49), (832, 480, 81), (1024, 576, 97), (1280, 704, 121)]
    caps = calibrate.parse_caps(calibrate.CAPS)
    assert caps["layerwise"][1] == (23.25, (1280, 704, 121)) and caps["layerwise_tiling"][0][0] == 15.25
    assert set(caps) <= set(calibrate.CONFIGS)


def _job(peak, shape="832x480x81", cap=None, ok=True):
    return {"shape": [int(x) for x in shape.split("x")], "steps": 4, "cap_gib": cap, "ok": ok, "oom": not ok,
            "nvml_peak_mib": peak, "wall_s": 1.0, "planner_peak_gib": 1.0}


def test_planner_points_mark_masked_jobs_held_back_shapes_and_capped_runs():
    rep = {"configs": [{"config": "tiling", "jobs": [_job(1000), _job(1000, "1024x576x97"), _job(1200, "1280x704x121"),
                                                     _job(900, cap=23.25), {"shape": [1, 1, 1], "skipped": "time"}]},
                       {"config": "module", "jobs": [_job(800)]}]}
    out = report.calibration_points([("src", rep)], held_back={"1024x576x97"}, no_fit={"module"})
    by_id = {p["id"]: p for p in out["points"]}
    assert by_id["tiling-832x480x81"]["valid"] and not by_id["tiling-1024x576x97"]["valid"]
    assert by_id["tiling-1024x576x97"]["role"] == "validation" and by_id["module-832x480x81"]["role"] == "validation"
    assert by_id["tiling-1280x704x121"]["role"] == "fit" and by_id["tiling-1280x704x121"]["offload"] == "none"
    assert [(c["cap_gib"], c["ran"]) for c in out["capped"]] == [(23.25, True)]


def test_head_to_head_table_gives_ours_over_native():
    runs = [{"side": "native", "run": "warm", "status": "success", "end_to_end_s": 20.0, "node_s": {"6": 0.2, "7": 0.2,
             "8": 6.0}, "sampler": {"s_per_step": 2.0}, "nvml_peak_mib": 36 * 1024, "host_ram": {"total_gib": 8.0}},
            {"side": "ours", "run": "warm", "status": "success", "end_to_end_s": 15.0, "server_stages": {
             "text_encode_s": 0.1, "denoise_s": 7.0, "steps": 4, "vae_decode_s": 4.0}, "nvml_peak_mib": 38 * 1024,
             "host_ram": {"total_gib": 12.0}}]
    table = report.head_to_head_table({"runs": runs})
    assert "| warm | end to end (s) | 20.00 | 15.00 | 0.75 |" in table
    assert "| warm | s / denoise step | 2.00 | 1.75 | 0.88 |" in table
    assert "| warm | text encode (s) | 0.40 | 0.10 | 0.25 |" in table
