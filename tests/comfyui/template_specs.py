"""What each shipped template in workflows/ holds, by node type, widget values *by name* and links: the
description make_workflows.py builds in a real front end. The Notes say what each needs (GPU memory,
downloads, setup) in words taken from the planner itself (`ti2v_plan`), and
tests/unit/test_template_plans.py checks them against the planner.
"""
from __future__ import annotations

import math

TI2V, T2V, I2V = ("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "Wan-AI/Wan2.2-T2V-A14B-Diffusers",
                  "Wan-AI/Wan2.2-I2V-A14B-Diffusers")
NEGATIVE = "blurry, low quality, distorted faces, jitter, flicker, watermark, text, static frame"
SETUP = ("Setup, once on the GPU machine: python -m vllm_omni_launcher setup (after pip install -e of this "
         "pack's folder) or, from the ComfyUI folder, bash "
         "custom_nodes/vllm-omni-launcher/server/create_server_env.sh. The first start downloads the model into "
         "the Hugging Face cache (Local Server shows it); a local folder in Load model skips that.")
RECOMMENDED = ("Generate video: 0 (or -1) means the model's recommended value")
TI2V_CARDS = {"large": 40, "mid": 24, "small": 16, "tiny": 8}   # GB: the cards the TI2V Notes speak of
# The lowest zoom a template opens at: ComfyUI's front end draws node text only from about 0.57 (an 8 px
# minimum of its 14 px font), so below it a wide template would open as blank boxes.
READABLE_ZOOM = 0.6


def ti2v_plan() -> str:
    """What 'auto' picks for the TI2V-5B defaults on common cards, in words, from the planner itself
    (`recommend` for the pinned vLLM-Omni line, which setup installs, and 64 GB of free system RAM);
    tests/unit/test_template_plans.py checks each phrase against the planner."""
    from vllm_omni_launcher.planner.ladder import recommend
    from vllm_omni_launcher.server.launch.versions import DEFAULT_VERSION

    rec = {k: recommend(TI2V, gpus=[float(gb)], host_available_gib=64.0, server_version=DEFAULT_VERSION)
           for k, gb in TI2V_CARDS.items()}
    if [rec[k].reduced for k in TI2V_CARDS] != [False, False, False, True]:
        picks = [(k, r.label, r.request.label()) for k, r in rec.items()]
        raise SystemExit(f"the TI2V Note's sentence no longer fits the planner: {picks}; rewrite ti2v_plan()")

    def words(key: str) -> str:       # "1 GPU + layerwise offload + VAE tiling" -> "layerwise offload + VAE tiling"
        return rec[key].label.split("1 GPU", 1)[1].lstrip(" ,+")
    layerwise = [r.plan.host_ram["needed_gib"] for r in rec.values() if r.spec.memory.offload == "layerwise"]
    frames = rec["mid"].asked.frames
    return (f"Serving config 'auto' lets the memory planner pick the fastest setup that fits the defaults below, "
            f"and Local Server shows what it chose. With {rec['mid'].calibration} (what setup installs): on "
            f"{TI2V_CARDS['large']} GB or more "
            f"{words('large')}; on a {TI2V_CARDS['mid']} GB card {words('mid')}; on {TI2V_CARDS['small']} GB "
            f"{words('small')}, still at the full {frames} frames; on smaller cards it lowers the frame count "
            f"({rec['tiny'].request.frames} frames on {TI2V_CARDS['tiny']} GB), which Generate video then uses "
            f"where frames is 0. Layerwise offload needs about {math.ceil(max(layerwise))} GB of free system RAM.")



def two_gpus(model: str, cards: tuple[int, ...]) -> str:
    """What 'auto' does with two GPUs of each size in `cards` (GB, ascending, from the size the Note asks for):
    it takes both, so a Note that asks for one GPU says so and how to keep the second free (Serving Config's
    gpus; `count=N` is the first N visible). From the planner like ti2v_plan() (64 GB of free system RAM, the
    line setup installs), checked on every common pair from cards[0] up: each takes both GPUs, and from
    cards[-1] up in one mode ("or larger"). tests/unit/test_template_plans.py checks each phrase and the
    node's own resolve."""
    from vllm_omni_launcher.planner.ladder import recommend
    from vllm_omni_launcher.server.launch.versions import DEFAULT_VERSION

    def mode(gb: int) -> str:         # "CFG parallel 2 + untiled VAE decode" -> "CFG parallel 2"
        rec = recommend(model, gpus=[float(gb)] * 2, host_available_gib=64.0, server_version=DEFAULT_VERSION)
        if rec.spec is None or rec.reduced or rec.spec.parallel.world_size != 2:
            raise SystemExit(f"{model} on two {gb} GB GPUs: 'auto' picks {rec.label!r}; rewrite two_gpus()")
        return rec.label.split(" + ", 1)[0]
    modes = {gb: mode(gb) for gb in sorted({*cards, *(g for g in (16, 20, 24, 32, 40, 48, 80, 141) if g > cards[0])})}
    if {modes[gb] for gb in modes if gb >= cards[-1]} != {modes[cards[-1]]}:
        raise SystemExit(f"{model}: 'auto' changes mode above two {cards[-1]} GB GPUs: {modes}; rewrite two_gpus()")
    picks = ", ".join(f"{modes[gb]} on {gb} GB" for gb in cards) + " or more" if cards[1:] else modes[cards[0]]
    return (f"With two GPUs of {cards[0]} GB or more 'auto' uses both ({picks}); gpus count=1 in Serving Config "
            "keeps the second free.")


TI2V_PLAN = ti2v_plan()
TI2V_TWO_GPUS = two_gpus(TI2V, (TI2V_CARDS["small"], TI2V_CARDS["mid"]))


def _serving(gpus: str, mode: str, degree: int = 2, vae_patch: int = 1, compile: bool = False) -> dict:  # noqa: A002
    # compile: off for TI2V-5B (one H200: 87 s more start for no measurable per-step gain) and for the 4-step
    # LoRA template (compile saved 0.3 s per A14B step, paying back after about 80 steps, not 4); the
    # 40-step A14B templates keep upstream's torch.compile (two jobs on a kept-alive server pay it back).
    return {"gpus": gpus, "parallel_mode": mode, "parallel_degree": degree, "vae_patch_parallel": vae_patch,
            "offload": "none", "fp8": False, "vae_tiling": False, "cache_backend": "none", "compile": compile,
            "keep_alive_minutes": 0, "auto_fallback": True}


def _generate(prompt: str, seed: int) -> dict:
    return {"prompt": prompt, "negative_prompt": NEGATIVE, "width": 0, "height": 0, "frames": 0, "fps": 0,
            "steps": 0, "guidance": -1, "guidance_2": -1, "boundary_ratio": -1, "flow_shift": -1, "seed": seed,
            "control_after_generate": "randomize"}


def _save(prefix: str) -> dict:
    return {"filename_prefix": prefix, "format": "auto", "codec": "auto"}


# Layout (canvas units): note top left, model + serving below it, server/image in the middle
# column, Generate video and Save video to the right. The note is as tall as its text (Note's
# monospace text: about 68 characters and 16 units a line at width 460), and the node under it
# starts below the next node's title bar and its source badge, so nothing needs scrolling or
# sits on the text.
NOTE_WIDTH, NOTE_CHARS, NOTE_LINE = 460, 68, 16
GAP_BELOW = 80      # canvas units from one node's bottom to the next node's top: title bar (30) + badge + margin


def note_height(text: str) -> int:
    lines = sum(max(1, -(-len(paragraph) // NOTE_CHARS)) for paragraph in text.split("\n"))
    return 24 + NOTE_LINE * lines


def _local_template(note: str, model: str, serving: dict, prompt: str, seed: int, prefix: str,
                    with_image: bool) -> dict:
    model_y = 40 + note_height(note) + GAP_BELOW
    serving_y = model_y + 60 + GAP_BELOW
    nodes = [
        {"key": "note", "type": "Note", "pos": [40, 40], "size": [NOTE_WIDTH, note_height(note)],
         "widgets": {"text": note}},
        {"key": "model", "type": "VLLMOmniLoadModel", "pos": [40, model_y], "size": [NOTE_WIDTH, 60],
         "widgets": {"model": model}},
        {"key": "serving", "type": "VLLMOmniServingConfig", "pos": [40, serving_y], "size": [NOTE_WIDTH, 320],
         "widgets": serving},
        {"key": "server", "type": "VLLMOmniLocalServer", "pos": [550, model_y], "size": [270, 50], "widgets": {}},
        {"key": "generate", "type": "VLLMOmniGenerateVideo", "pos": [870, 40], "size": [420, 640],
         "widgets": _generate(prompt, seed)},
        {"key": "save", "type": "SaveVideo", "pos": [1340, 40], "size": [420, 480], "widgets": _save(prefix)},
    ]
    links = [["model", "model", "server", "model"], ["serving", "serving", "server", "serving"],
             ["server", "server", "generate", "server"], ["generate", "video", "save", "video"]]
    if with_image:
        nodes.append({"key": "image", "type": "LoadImage", "pos": [550, serving_y], "size": [270, 330],
                      "widgets": {"image": "example.png"}})
        links.append(["image", "IMAGE", "generate", "image"])
    return {"nodes": nodes, "links": links}


def _seed_sweep_template(note: str, model: str, serving: dict, prompt: str, seed: int, count: int,
                         prefix: str) -> dict:
    """One prompt made `count` times with seeds seed .. seed+count-1 by Generate Batch (all jobs sent at
    once), every clip saved by Save Video (it runs once per clip of the VIDEO list)."""
    template = _local_template(note, model, serving, prompt, seed, prefix, with_image=False)
    batch = next(n for n in template["nodes"] if n["key"] == "generate")
    widgets = {("prompts" if k == "prompt" else k): v for k, v in batch["widgets"].items()}
    widgets.update(batch_count=count, control_after_generate="fixed")
    batch.update(type="VLLMOmniGenerateBatch", size=[420, 700], widgets=widgets)
    template["links"] = [["generate", "videos", "save", "video"] if link[0] == "generate" else link
                         for link in template["links"]]
    return template


LIGHTX2V_HIGH = "wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors"
LIGHTX2V_LOW = "wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors"


def _distill_lora_template(note: str, model: str, serving: dict, prompt: str, seed: int, prefix: str) -> dict:
    """A14B with a 4-step distill LoRA pair: one LoRA node per expert between Load Model and Local
    Server, and Generate at 4 steps, guidance 1 on both experts, Euler."""
    template = _local_template(note, model, serving, prompt, seed, prefix, with_image=False)
    serving_y = next(n for n in template["nodes"] if n["key"] == "serving")["pos"][1]
    template["nodes"] += [
        {"key": "lora_high", "type": "VLLMOmniLora", "pos": [550, serving_y], "size": [300, 130],
         "widgets": {"lora_name": LIGHTX2V_HIGH, "strength": 1.0, "expert": "high_noise"}},
        {"key": "lora_low", "type": "VLLMOmniLora", "pos": [550, serving_y + 130 + GAP_BELOW], "size": [300, 130],
         "widgets": {"lora_name": LIGHTX2V_LOW, "strength": 1.0, "expert": "low_noise"}},
    ]
    generate = next(n for n in template["nodes"] if n["key"] == "generate")
    generate["widgets"].update(steps=4, guidance=1.0, guidance_2=1.0, sampler="euler")
    template["links"] = [link for link in template["links"] if link[0] != "model"] + [
        ["model", "model", "lora_high", "model"], ["lora_high", "model", "lora_low", "model"],
        ["lora_low", "model", "server", "model"]]
    return template


def _pipeline_template(note: str, model: str, generate_type: str, generate: dict, prefix: str,
                       media: list[dict], media_links: list[list[str]]) -> dict:
    """A VACE / S2V / FastWan graph: Load Wan Pipeline Model and Serving Config into Local Server, the job
    node fed by ComfyUI's own loaders (`media`, linked by `media_links`), Save Video."""
    model_y = 40 + note_height(note) + GAP_BELOW
    serving_y = model_y + 60 + GAP_BELOW
    job_x = 1220 if any(m["pos"] and m["pos"][0] > 550 for m in media) else 870   # after a third column
    nodes = [
        {"key": "note", "type": "Note", "pos": [40, 40], "size": [NOTE_WIDTH, note_height(note)],
         "widgets": {"text": note}},
        {"key": "model", "type": "VLLMOmniLoadPipelineModel", "pos": [40, model_y], "size": [NOTE_WIDTH, 60],
         "widgets": {"model": model}},
        {"key": "serving", "type": "VLLMOmniServingConfig", "pos": [40, serving_y], "size": [NOTE_WIDTH, 320],
         "widgets": _serving("auto", "auto")},
        {"key": "server", "type": "VLLMOmniLocalServer", "pos": [550, model_y], "size": [270, 50], "widgets": {}},
        {"key": "generate", "type": generate_type, "pos": [job_x, 40], "size": [420, 560], "widgets": generate},
        {"key": "save", "type": "SaveVideo", "pos": [job_x + 470, 40], "size": [420, 480], "widgets": _save(prefix)},
        *({**m, "pos": m["pos"] or [550, serving_y]} for m in media),   # None: level with Serving Config
    ]
    links = [["model", "model", "server", "model"], ["serving", "serving", "server", "serving"],
             ["server", "server", "generate", "server"], ["generate", "video", "save", "video"], *media_links]
    return {"nodes": nodes, "links": links}


def _pipeline_generate(prompt: str, seed: int, **widgets: object) -> dict:
    return {"prompt": prompt, "negative_prompt": NEGATIVE, "width": 0, "height": 0, "frames": 0, "steps": 0,
            "guidance": -1, "seed": seed, "control_after_generate": "randomize", **widgets}


VACE_NOTE = (
    "Wan2.1 VACE-1.3B: video that follows a control video; needs one GPU\n\n"
    "Load Video reads control.mp4 from ComfyUI's input folder (upload yours: a depth, pose or edge video, or a "
    "source clip); Get Video Components gives its frames, Image From Batch keeps the first 81 and Upscale Image "
    "makes them 832x480: the control video must be exactly as long and as large as the request (Generate VACE "
    "Video refuses another length or size before sending). For reference images instead, connect an IMAGE batch "
    "(1-4 images) to reference_images and disconnect control_video: the server takes one or the other.\n\n"
    "Needs: one NVIDIA GPU with 24 GB or more: the planner's estimate (measured: within 3%) is about "
    "24 GiB at 832x480, 81 frames, so on a 24 GB card Serving Config 'auto' adds layerwise offload. Model "
    "download: Wan-AI/Wan2.1-VACE-1.3B-diffusers, about 20 GB (estimated; VACE-14B: about 80 GB and 57 GiB). "
    + two_gpus("Wan-AI/Wan2.1-VACE-1.3B-diffusers", (24,)) + " "
    "Masks and first/last frames are not possible: vLLM-Omni's HTTP API does not carry them.\n\n"
    + RECOMMENDED + ": 832x480, 81 frames at 16 fps, 50 steps. Sizes must be multiples of 16, frames 4k+1.\n\n"
    + SETUP)
S2V_NOTE = (
    "Wan2.2 S2V-14B: a portrait that speaks or sings; needs one GPU\n\n"
    "Load Image reads example.png (the face to animate) and Load Audio speech.wav (at most 20 s) from ComfyUI's "
    "input folder: upload your own. The video is as long as the audio, at 16 fps, in parts of 80 frames, with the "
    "audio in the saved MP4.\n\n"
    "Needs: one NVIDIA GPU with 80 GB or more; the planner's estimate (measured: within 2%) is about "
    "54 GiB at 832x448. Model download: Wan-AI/Wan2.2-S2V-14B (the original Wan layout, served with "
    "--model-class-name WanS2VPipeline, which the launcher adds), about 45 GB. "
    + two_gpus("Wan-AI/Wan2.2-S2V-14B", (80,)) + "\n\n"
    + RECOMMENDED + ": 832x448, 80 frames per part, 40 steps. Sizes must be multiples of 16.\n\n" + SETUP)
FAST_NOTE = (
    "FastWan2.2 TI2V-5B: text to video in 3 steps; needs one GPU\n\n"
    "A step-distilled TI2V-5B: the server runs its own 3 steps without CFG, so steps stay 0 and guidance -1 "
    "(Generate Video refuses other values, which the server would ignore). Needs vLLM-Omni 0.30 and one NVIDIA "
    "GPU with 40 GB or more: the planner's estimate (measured: within 4%) is about 38 GiB at 1280x704, "
    "121 frames; Serving config 'auto' offloads on smaller cards. Model download: "
    "FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers, about 23 GB. "
    + two_gpus("FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", (40, 48)) + "\n\n"
    + RECOMMENDED + ": 1280x704, 121 frames at 24 fps. Sizes must be multiples of 32, frames 4k+1.\n\n" + SETUP)


REMOTE_NOTE = (
    "Remote vLLM-Omni server\n\n"
    "Uses a vLLM-Omni server that already runs elsewhere, e.g. started on the GPU machine with "
    "python -m vllm_omni_launcher serve --model Wan-AI/Wan2.2-TI2V-5B-Diffusers --host 0.0.0.0 "
    "--port 8091 --api-key-file server.key\n"
    "This machine needs no GPU. Pick a server your launcher config names in remote_server, or set "
    "the URL (no /v1); set the model family the server runs.\n\n"
    "API key: never in the workflow. It comes from this machine's launcher config (remote_servers in "
    "vllm_omni_launcher.json, or VLLM_OMNI_LAUNCHER_REMOTE_URL with VLLM_OMNI_LAUNCHER_REMOTE_API_KEY) "
    "and is sent only to the origin configured with it, never to a URL a workflow chose.\n\n"
    + RECOMMENDED + " of the family chosen in Remote server.")


TEMPLATES: dict[str, dict] = {
    "wan22_ti2v_5b_text_to_video": _local_template(
        "Wan2.2 TI2V-5B: text to video; needs one GPU\n\n"
        "Needs: one NVIDIA GPU with 16 GB or more. " + TI2V_PLAN + " " + TI2V_TWO_GPUS + " Model download: "
        "Wan-AI/Wan2.2-TI2V-5B-Diffusers, about 23 GB.\n\n"
        + RECOMMENDED + ": 1280x704, 121 frames at 24 fps, 50 steps. Sizes must be multiples of 32, frames 4k+1.\n\n"
        + SETUP,
        TI2V, _serving("auto", "auto"),
        "A red fox trotting through fresh snow in a birch forest at sunrise, soft golden light, "
        "slow tracking shot, cinematic", 42, "video/wan22_ti2v_5b", with_image=False),
    "wan22_ti2v_5b_image_to_video": _local_template(
        "Wan2.2 TI2V-5B: image to video; needs one GPU\n\n"
        "Needs: one NVIDIA GPU with 16 GB or more. " + TI2V_PLAN + " " + TI2V_TWO_GPUS + " Model download: "
        "Wan-AI/Wan2.2-TI2V-5B-Diffusers, about 23 GB.\n\n"
        "Load image uses example.png from ComfyUI's input folder: upload your own start frame there. "
        "The prompt describes the motion.\n\n"
        + RECOMMENDED + ": 1280x704, 121 frames at 24 fps, 50 steps.\n\n" + SETUP,
        TI2V, _serving("auto", "auto"),
        "A hand-drawn cartoon girl with big yellow hair waves her arms and dances on a green hill under a "
        "blue sky, clouds drifting by, simple crayon animation", 42, "video/wan22_ti2v_5b_i2v", with_image=True),
    "wan22_t2v_a14b_2gpu_ulysses": _local_template(
        "Wan2.2 T2V-A14B: text to video on two GPUs (Ulysses sequence parallel)\n\n"
        "Needs: two NVIDIA GPUs with 80 GB or more each, NVLink recommended: planned peak about 72 GiB per "
        "GPU at 832x480, 81 frames. Serving: gpus count=2, ulysses degree 2, "
        "VAE patch parallel 2; auto fallback steps down (offload/tiling) on out-of-memory. Model download: "
        "Wan-AI/Wan2.2-T2V-A14B-Diffusers, about 65 GB.\n\n"
        + RECOMMENDED + ": 832x480, 81 frames at 16 fps, 40 steps. Sizes must be multiples of 16.\n\n" + SETUP,
        T2V, _serving("count=2", "ulysses", 2, 2, compile=True),
        "A paper boat drifting down a rain-soaked city street at night, neon reflections rippling on the "
        "water, low camera angle, shallow depth of field", 42, "video/wan22_t2v_a14b", with_image=False),
    "wan22_i2v_a14b_2gpu_cfg": _local_template(
        "Wan2.2 I2V-A14B: image to video on two GPUs (CFG parallel)\n\n"
        "Needs: two NVIDIA GPUs with 80 GB or more each; CFG parallel runs the positive and negative prompt "
        "on one GPU each and works well without NVLink. Planned peak about 74 GiB per GPU at 832x480, "
        "81 frames. Model download: Wan-AI/Wan2.2-I2V-A14B-Diffusers, about 65 GB.\n\n"
        "I2V-A14B needs a start image: Load image uses example.png from ComfyUI's input folder.\n\n"
        + RECOMMENDED + ": 832x480, 81 frames at 16 fps, 40 steps.\n\n" + SETUP,
        I2V, _serving("count=2", "cfg", 2, 2, compile=True),
        "A hand-drawn cartoon girl with big yellow hair waves her arms and dances on a green hill under a "
        "blue sky, clouds drifting by, simple crayon animation", 42, "video/wan22_i2v_a14b", with_image=True),
    "wan22_t2v_a14b_4step_lora": _distill_lora_template(
        "Wan2.2 A14B 4-step LoRA: text to video in 4 steps with a distill LoRA pair (lightx2v)\n\n"
        "Needs: vLLM-Omni 0.30 (fuses single-file LoRAs at startup) and two NVIDIA GPUs with 80 GB or more "
        "each: planned peak about 72 GiB per GPU at 832x480, 81 frames. Put the two LoRA files (high-noise and "
        "low-noise) in ComfyUI/models/loras and pick them in the two LoRA nodes. They are fused into the "
        "server when it starts (strength 1.0): changing one restarts the server. Model download: "
        "Wan-AI/Wan2.2-T2V-A14B-Diffusers, about 65 GB.\n\n"
        "Distill settings: 4 steps, guidance 1 on both experts (no CFG, so CFG parallel would do nothing: "
        "the two GPUs run Ulysses sequence parallel), sampler euler. Sizes must be multiples of 16.\n\n" + SETUP,
        T2V, _serving("count=2", "ulysses", 2, 2),
        "A paper boat drifting down a rain-soaked city street at night, neon reflections rippling on the "
        "water, low camera angle, shallow depth of field", 42, "video/wan22_t2v_a14b_4step"),
    "wan22_ti2v_5b_seed_sweep": _seed_sweep_template(
        "Wan2.2 TI2V-5B: seed sweep, one prompt as 4 clips; needs one GPU\n\n"
        "Generate Batch makes the prompt batch_count times with seeds seed, seed+1, ... (42 to 45 here; the seed "
        "stays fixed, so the sweep is repeatable: queue Generate Video with the seed you like). All jobs go to "
        "the server at once: a server with request batching or replicas runs them together. Save Video saves "
        "every clip; the frames output is all clips as one IMAGE batch. The local config's max_batch_clips "
        "(default 8) caps prompts x batch_count, and every clip's frames stay in memory until the node "
        "ends (about 1.3 GB a clip at the defaults).\n\n"
        "Needs: one NVIDIA GPU with 16 GB or more. " + TI2V_PLAN + " " + TI2V_TWO_GPUS
        + " Local Server may suggest replicas for the batch instead. Model download: "
        "Wan-AI/Wan2.2-TI2V-5B-Diffusers, about 23 GB.\n\n"
        + RECOMMENDED.replace("Generate video", "Generate batch") + ": 1280x704, 121 frames at 24 fps, 50 steps. "
        "Sizes must be multiples of 32, frames 4k+1.\n\n" + SETUP,
        TI2V, _serving("auto", "auto"),
        "A lighthouse on a rocky cliff during a storm, waves crashing, beam of light sweeping through rain, "
        "dramatic clouds, cinematic wide shot", 42, 4, "video/wan22_ti2v_5b_seed_sweep"),
    "wan21_vace_control_video": _pipeline_template(
        VACE_NOTE, "Wan-AI/Wan2.1-VACE-1.3B-diffusers", "VLLMOmniGenerateVACE",
        _pipeline_generate("A dancer in a flowing red dress spins on a wooden stage, warm spotlight, smooth motion",
                           42), "video/wan21_vace",
        [{"key": "video", "type": "LoadVideo", "pos": None, "size": [270, 330],
          "widgets": {"file": "control.mp4"}},
         {"key": "components", "type": "GetVideoComponents", "pos": [870, 40], "size": [300, 90], "widgets": {}},
         {"key": "trim", "type": "ImageFromBatch", "pos": [870, 200], "size": [300, 100],
          "widgets": {"batch_index": 0, "length": 81}},
         {"key": "scale", "type": "ImageScale", "pos": [870, 370], "size": [300, 140],
          "widgets": {"upscale_method": "lanczos", "width": 832, "height": 480, "crop": "center"}}],
        [["video", "VIDEO", "components", "video"], ["components", "images", "trim", "image"],
         ["trim", "IMAGE", "scale", "image"], ["scale", "IMAGE", "generate", "control_video"]]),
    "wan22_s2v_speech_to_video": _pipeline_template(
        S2V_NOTE, "Wan-AI/Wan2.2-S2V-14B", "VLLMOmniGenerateSpeechToVideo",
        _pipeline_generate("A woman sings on a small stage, gentle head movements, soft stage light", 42),
        "video/wan22_s2v",
        [{"key": "image", "type": "LoadImage", "pos": None, "size": [270, 330],
          "widgets": {"image": "example.png"}},
         {"key": "audio", "type": "LoadAudio", "pos": [870, 40], "size": [300, 140],
          "widgets": {"audio": "speech.wav"}}],
        [["image", "IMAGE", "generate", "image"], ["audio", "AUDIO", "generate", "audio"]]),
    "fastwan_ti2v_5b_fast_text_to_video": _pipeline_template(
        FAST_NOTE, "FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", "VLLMOmniGenerateVideo",
        _generate("A red fox trotting through fresh snow in a birch forest at sunrise, soft golden light, "
                  "slow tracking shot, cinematic", 42), "video/fastwan_ti2v_5b", [], []),
    "remote_server": {
        "nodes": [
            {"key": "note", "type": "Note", "pos": [40, 40], "size": [NOTE_WIDTH, note_height(REMOTE_NOTE)],
             "widgets": {"text": REMOTE_NOTE}},
            {"key": "server", "type": "VLLMOmniRemoteServer", "pos": [40, 40 + note_height(REMOTE_NOTE) + GAP_BELOW],
             "size": [NOTE_WIDTH, 90], "widgets": {"url": "http://127.0.0.1:8091", "model_family": "ti2v_5b"}},
            {"key": "generate", "type": "VLLMOmniGenerateVideo", "pos": [550, 40], "size": [420, 640],
             "widgets": _generate("An astronaut riding a horse across a desert at dusk, wide shot, dust "
                                  "drifting in the warm light", 42)},
            {"key": "save", "type": "SaveVideo", "pos": [1020, 40], "size": [420, 480],
             "widgets": _save("video/vllm_omni_remote")},
        ],
        "links": [["server", "server", "generate", "server"], ["generate", "video", "save", "video"]],
    },
}
