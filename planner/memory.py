"""Peak GPU memory of a vLLM-Omni Wan2.2 server, per GPU, as named terms.

`plan(spec, request, gpus)` answers "will this launch spec run this request on these GPUs,
and with how much to spare?" before any process starts. The estimate follows what the
0.30 code does (file references are to the vllm-omni 0.30.0 wheel):

* Weights are loaded in bf16, the VAE too. Both A14B experts stay resident; server
  `--boundary-ratio 1.0` loads only `transformer_2`, `0.0` only `transformer`
  (`pipeline_wan2_2.py:427-457`). The UMT5-XXL text encoder stays on every rank, unsharded
  by TP and HSDP (HSDP shards only the transformer blocks, `_hsdp_shard_conditions`). S2V's
  wav2vec2 audio encoder stays on the GPU too, at its checkpoint's dtype (fp32; model_sizes.py).
* Denoising keeps one block's activations at a time (inference), so the working set is
  linear in the tokens a rank holds: latent frames (F-1)/4+1 x (H/vae/2) x (W/vae/2),
  divided by the Ulysses/ring degree. CFG runs the two branches one after another
  (`distributed/cfg_parallel.py:155-157`), so CFG does not double the activations; CFG
  parallel gives each rank one branch. Request batching (`batch` > 1) does multiply them.
* The pipeline empties the CUDA cache before the VAE decode (`pipeline_wan2_2.py:952-955`),
  so the decode is its own phase: weights + decode working set (+ the allocator slack a
  serving process adds, see `decode_server_slack`). Untiled, the Wan VAE decodes one latent
  frame at a time at full resolution, so its working set grows with H x W and barely with
  frames (only the output, F x H x W); tiled (256-pixel tiles, diffusers' default) it is
  tile-sized plus the decoded tiles kept for blending and the blended copies, so it grows
  with F x H x W. Both measured on an H200 (bench/memory/results/h200-vae-decode.json).
  `--vae-patch-parallel-size` turns tiling on (`registry.py:475-480`), spreads tiles over
  ranks and gathers them on rank 0. `--vae-use-slicing` only splits a batch, so it saves nothing at batch 1.
* I2V-A14B encodes its condition video (the image plus F-1 black frames) at full
  resolution before denoising (`pipeline_wan2_2_i2v.py`), a third phase.
* Module offload swaps the text encoder and each DiT expert (only one of them on the GPU
  at a time, `offloader/sequential_backend.py:186-191`); layerwise offload streams DiT
  blocks with about two resident per expert (0.26 keeps the text encoder resident, 0.30 streams
  its blocks too); FP8 halves the DiT's linear weights (upstream marks Wan2.2 quantization
  unvalidated).

The coefficients differ per vLLM-Omni line (`server_version`; the pinned 0.30 when not
given): they, and what fixed each, are in planner/calibration.py; the result types in
planner/memory_plan.py. All sizes are GiB (2**30 bytes); GPU "GB" (80 GB H100, 24 GB 4090)
are GiB in practice.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from ..models import WanFamily
from ..server.launch.spec import LaunchSpec
from .calibration import TILE_PX, calibrated_line, calibration_for
from .gpus import GpuInfo, hypothetical_gpus, query_gpus
from .memory_plan import GpuPlan, MemoryPlan, MemoryTerm
from .model_sizes import BF16, GIB, ModelSizes, model_sizes
from .request_shape import RequestShape
from .speed_costs import family_runs_cfg


# --------------------------------------------------------------------------------------
GpuArg = Union[None, Sequence[GpuInfo], Sequence[float]]


def _resolve_gpus(spec: LaunchSpec, gpus: GpuArg, nvml: Any = None) -> tuple[list[Optional[GpuInfo]], str]:
    """The GPU each rank runs on, and where that list came from."""
    world = spec.parallel.world_size
    if gpus is None:
        found, reason = query_gpus(nvml)
        if not found:
            return [None] * world, f"no GPU information: {reason}"
        source = "NVML"
        pool: list[GpuInfo] = found
    elif gpus and isinstance(gpus[0], (int, float)):
        pool = hypothetical_gpus([float(x) for x in gpus])   # type: ignore[arg-type]
        source = "given sizes (--gpu-memory)"
    else:
        pool = list(gpus)   # type: ignore[arg-type]
        source = "given GPUs"
    if spec.gpus is not None:
        by_index = {g.index: g for g in pool}
        chosen: list[Optional[GpuInfo]] = [by_index.get(i) for i in spec.gpus[:world]]
    else:
        chosen = list(pool[:world])
    chosen += [None] * (world - len(chosen))
    return chosen, source


def plan(spec: LaunchSpec, request: Optional[RequestShape] = None, gpus: GpuArg = None, *,
         sizes: Optional[ModelSizes] = None, host_available_gib: Optional[float] = -1.0,
         nvml: Any = None, calibration: Optional[dict[str, float]] = None,
         lora_adapter_gib: float = 0.0, server_version: Optional[tuple[int, int]] = None) -> MemoryPlan:
    """Estimate each GPU's peak for `spec` serving `request`.

    gpus: None (ask NVML), a list of GpuInfo, or a list of sizes in GiB (hypothetical cards).
    host_available_gib: -1 asks psutil when offload is on; None means unknown.
    lora_adapter_gib: the per-request PEFT adapter's GPU copy (server/launch/loras.py: adapter_gpu_gib);
    fused LoRAs come from `spec.lora`.
    server_version: the vLLM-Omni line the server runs ((0, 26), (0, 30)); None: the pinned default.
    """
    family = spec.family
    request = request or RequestShape.default_for(family)
    sizes = sizes or model_sizes(spec.model)
    cal = dict(calibration_for(server_version), **(calibration or {}))
    placed, source = _resolve_gpus(spec, gpus, nvml)
    world = spec.parallel.world_size
    notes: list[str] = list(sizes.notes)
    plans = [_rank_plan(spec, request, sizes, family, rank, world, placed[rank], cal, lora_adapter_gib)
             for rank in range(world)]
    fits: Optional[bool] = None if any(p.fits is None for p in plans) else all(p.fits for p in plans)
    host = _host_ram(spec, sizes, host_available_gib, cal) if spec.memory.offload != "none" else {}
    if host.get("ok") is False and fits:
        fits = False
        notes.append("host RAM is too small for the offloaded weights (pinned CPU copies)")
    if gpus is None and placed and placed[0] is None:
        notes.append(source)
    _general_notes(spec, request, family, notes, server_version)
    return MemoryPlan(spec=spec, request=request, sizes=sizes, gpus=plans, fits=fits, host_ram=host,
                      notes=_dedupe(notes), gpu_source=source, server_version=server_version)


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    return [x for x in items if not (x in seen or seen.add(x))]


def _loaded_experts(spec: LaunchSpec, sizes: ModelSizes) -> list[int]:
    n = len(sizes.dit_params)
    br = spec.runtime.boundary_ratio
    if n == 2 and br == 1.0:
        return [1]
    if n == 2 and br == 0.0:
        return [0]
    return list(range(n))


def _rank_plan(spec: LaunchSpec, req: RequestShape, sizes: ModelSizes, family: WanFamily, rank: int, world: int,
               gpu: Optional[GpuInfo], cal: dict[str, float], lora_adapter_gib: float = 0.0) -> GpuPlan:
    p, m = spec.parallel, spec.memory
    mode = p.mode
    sp = p.degree if mode in ("ulysses", "ring") else 1
    tp = p.degree if mode == "tensor" else 1
    shard = p.degree if (mode == "hsdp" or (p.hsdp and mode != "none")) else 1
    terms: list[MemoryTerm] = []

    # ---- weights ----------------------------------------------------------------------
    experts = _loaded_experts(spec, sizes)
    wfrac = cal["fp8_weight_fraction"] if m.quantization == "fp8" else 1.0
    expert_gib = [sizes.dit_gib(i) * wfrac for i in experts]
    block_gib = [g * 0.985 / sizes.dit.layers for g in expert_gib]
    dit_all = sum(expert_gib)
    te = sizes.text_encoder_gib
    vae_w = sizes.vae_gib
    what = "both A14B experts" if len(experts) == 2 else ("one A14B expert (boundary_ratio "
                                                          f"{spec.runtime.boundary_ratio:g})" if sizes.dit_params[1:] else "DiT")
    q = " FP8" if m.quantization == "fp8" else " bf16"
    if m.offload == "layerwise":
        resident = sum(g * 0.015 + b * cal["layerwise_resident_blocks"] for g, b in zip(expert_gib, block_gib))
        terms.append(MemoryTerm("DiT weights (layerwise offload)", resident, "resident",
                                f"{what}{q}: ~{cal['layerwise_resident_blocks']:g} blocks per expert on the GPU, "
                                "the rest streamed from pinned host RAM"))
        dit_resident, dit_swapped = resident, 0.0
    elif m.offload == "module":
        biggest = max(expert_gib) / (tp * shard)
        dit_resident, dit_swapped = 0.0, biggest
        terms.append(MemoryTerm("DiT weights (module offload)", biggest, "denoise",
                                f"{what}{q}: one expert on the GPU at a time, swapped with the text encoder"))
    else:
        dit_resident = dit_all / (tp * shard) + (dit_all * 0.02 * (1 - 1 / tp) if tp > 1 else 0.0)
        dit_swapped = 0.0
        how = f", split {tp} ways by TP (norms/embeddings replicated)" if tp > 1 else \
              (f", sharded {shard} ways by HSDP" if shard > 1 else "")
        terms.append(MemoryTerm("DiT weights", dit_resident, "resident", f"{what}{q}{how}"))
    if m.offload == "module":
        terms.append(MemoryTerm("text encoder (module offload)", te, "text",
                                "UMT5-XXL bf16, on the GPU only while encoding the prompt"))
        te_resident = 0.0
    elif m.offload == "layerwise" and cal["layerwise_te_resident_fraction"] < 1.0:
        te_resident = te * cal["layerwise_te_resident_fraction"]
        terms.append(MemoryTerm("text encoder (layerwise offload)", te_resident, "resident",
                                "UMT5-XXL bf16: its token embedding and a block on the GPU, the other blocks "
                                "streamed from pinned host RAM (vLLM-Omni 0.30)"))
    else:
        te_resident = te
        twice = " (with a second copy of its token embedding: S2V's converted checkpoint)" \
            if sizes.embedding_copy_params else ""
        terms.append(MemoryTerm("text encoder", te, "resident",
                                f"UMT5-XXL bf16{twice}, a full copy on every rank (TP and HSDP do not shard it)"))
    terms.append(MemoryTerm("VAE weights", vae_w, "resident", f"{sizes.vae_kind} VAE bf16"))
    resident = dit_resident + te_resident + vae_w
    if sizes.audio_encoder_params:         # S2V: moved to the GPU whatever the offload (model_sizes.py)
        terms.append(MemoryTerm("audio encoder", sizes.audio_encoder_gib, "resident",
                                f"wav2vec2 {sizes.audio_encoder_params / 1e9:.2f} B parameters at "
                                f"{sizes.audio_encoder_bytes:g} bytes each, its checkpoint's dtype, not the server's"))
        resident += sizes.audio_encoder_gib
    # LoRAs. Fused (distill) ones add nothing once loaded, but each weight's delta B@A is formed on
    # the GPU next to it while loading; the largest is an FFN matrix (and its dtype cast).
    lora_load = 0.0
    if spec.lora.lora_paths:
        lora_load = 2 * sizes.dit.hidden * sizes.dit.ffn_dim * BF16 / GIB
        terms.append(MemoryTerm("fused LoRA (load only)", lora_load, "load",
                                "one weight's LoRA delta at a time while fusing at startup; nothing after"))
    if lora_adapter_gib > 0:
        terms.append(MemoryTerm("LoRA adapter (per request)", lora_adapter_gib, "resident",
                                "the PEFT adapter's A/B matrices on the GPU, in every expert it binds; "
                                "kept after the first request that uses it"))
        resident += lora_adapter_gib

    # ---- denoise ------------------------------------------------------------------------
    tokens = req.tokens(family)
    tok_rank = -(-tokens // sp)
    hidden_bytes = sizes.dit.hidden * 2
    units_rep = cal["act_units_replicated"]
    units = units_rep + (cal.get(f"act_units_{family.key}", cal["act_units"]) - units_rep) / tp
    act = tok_rank * hidden_bytes * units * req.batch / GIB
    split = f", 1/{sp} of the sequence (Ulysses/ring)" if sp > 1 else ""
    split += f", attention/FFN split {tp} ways (TP)" if tp > 1 else ""
    terms.append(MemoryTerm("DiT activations", act, "denoise",
                            f"{tok_rank:,} tokens on this rank x {units:.1f} hidden vectors{split}"))
    denoise = act
    if sizes.dit.vace_blocks:
        hints = sizes.dit.vace_blocks * tok_rank * hidden_bytes * req.batch / GIB
        terms.append(MemoryTerm("VACE hints", hints, "denoise",
                                f"the {sizes.dit.vace_blocks} VACE blocks' outputs, all held through the forward"))
        denoise += hints
    if family.expand_timesteps:      # TI2V-5B's DiT (FastWan's too)
        temb = tok_rank * hidden_bytes * cal["temb_units_ti2v"] * req.batch / GIB
        terms.append(MemoryTerm("per-token timestep modulation", temb, "denoise",
                                "TI2V-5B expand_timesteps: 6 x hidden fp32 per token"))
        denoise += temb
    lat_f, lat_h, lat_w = req.latent(family)
    latent_gib = lat_f * lat_h * lat_w * family.latent_channels * 4 * req.batch / GIB
    if family_runs_cfg(family, req.cfg):     # a step-distilled server forces guidance 1: no second branch
        cfg_gib = 2 * latent_gib + 2 * 512 * sizes.dit.text_dim * 2 / GIB
        note = ("CFG parallel: this rank runs one branch" if mode == "cfg" else
                "positive and negative branches run one after another (no doubled activations); "
                "holds the positive prediction and the negative prompt")
        terms.append(MemoryTerm("CFG", cfg_gib, "denoise", note))
        denoise += cfg_gib
    terms.append(MemoryTerm("latents and scheduler state", 3 * latent_gib, "denoise", "fp32"))
    denoise += 3 * latent_gib
    if shard > 1 and m.offload != "layerwise":
        gathered = max(block_gib) * cal["hsdp_gathered_blocks"]
        terms.append(MemoryTerm("HSDP gathered blocks", gathered, "denoise",
                                f"{cal['hsdp_gathered_blocks']:g} full blocks gathered at a time"))
        denoise += gathered
    if dit_swapped:
        denoise += dit_swapped
    workspace = 0.0
    if world > 1:
        workspace = cal.get(f"workspace_{mode}", 0.0) if mode != "hsdp" else 0.0
        if shard > 1:
            workspace += cal["workspace_hsdp"]
        terms.append(MemoryTerm("parallel workspace", workspace, "denoise",
                                "all-to-all / all-gather buffers the allocator keeps (fitted)"))

    # ---- VAE decode ---------------------------------------------------------------------
    decode, dec_note, tiled = _vae_decode_gib(req, sizes, spec, rank, cal)
    terms.append(MemoryTerm("VAE decode", decode, "decode", dec_note + " [measured on H200]"))
    slack = cal["decode_server_slack_tiled" if tiled else "decode_server_slack"] * decode
    terms.append(MemoryTerm("VAE decode allocator slack", slack, "decode",
                            "reserved beyond the isolated decode in a serving process (fitted to H200 peaks)"))
    decode_reserved = decode + slack
    decode_total = decode_reserved + dit_swapped + workspace   # the DiT stays on the GPU after denoising
    carry = cal["decode_carry_tiled" if tiled else "decode_carry"]

    phases = {"resident": resident,
              "text": resident + (te if m.offload == "module" else 0.0) + 0.15,
              "denoise": resident + denoise + workspace + carry * decode_reserved,
              "decode": resident + decode_total}
    if lora_load:
        phases["load"] = resident + lora_load
    if family.image_input == "required" or family.pipeline == "vace":
        enc, enc_note = _vae_encode_gib(req, spec, cal, family.pipeline)
        what = {"vace": "VACE context: control video or blank", "s2v": "S2V reference and motion frames"}
        terms.append(MemoryTerm(f"VAE encode ({what.get(family.pipeline, 'I2V condition')})", enc, "encode",
                                enc_note))
        phases["encode"] = resident + enc + (te if m.offload == "module" else 0.0)
    peak_phase = max((k for k in phases if k != "resident"), key=lambda k: phases[k])
    torch_peak = phases[peak_phase]

    outside = cal["cuda_context_gib"] + (cal["nccl_gib"] if world > 1 else 0.0)
    terms.append(MemoryTerm("CUDA context and workspaces", cal["cuda_context_gib"], "outside",
                            "outside PyTorch's allocator"))
    if world > 1:
        terms.append(MemoryTerm("NCCL buffers", cal["nccl_gib"], "outside", f"world of {world} GPUs"))

    margin = 0.0
    fits: Optional[bool] = None
    headroom: Optional[float] = None
    if gpu is not None:
        margin = max(cal["margin_min_gib"], cal["margin_fraction"] * gpu.total_gib)
        headroom = gpu.available_gib - (torch_peak + outside) - margin
        fits = headroom >= 0
    return GpuPlan(rank=rank, gpu=gpu, terms=terms, phases=phases, peak_phase=peak_phase,
                   torch_peak_gib=torch_peak, outside_gib=outside, margin_gib=margin, fits=fits,
                   headroom_gib=headroom)


def _vae_decode_gib(req: RequestShape, sizes: ModelSizes, spec: LaunchSpec, rank: int,
                    cal: dict[str, float]) -> tuple[float, str, bool]:
    """Decode working set on this rank (GiB, reserved, as measured in isolation), how it was counted,
    and whether it is tiled.

    Untiled: vae_decode_px x H x W (one latent frame at a time; flat in frames) + the video.
    Tiled: a tile's working set + all tiles kept for blending + the blended copies of the video;
    with patch parallel each rank decodes 1/pp of the tiles and rank 0 gathers and blends them.
    """
    px_coef = cal.get(f"vae_decode_px_{sizes.vae_kind}", cal["vae_decode_px_wan2.1"])
    w, h, f = req.width, req.height, req.frames
    video = 3 * f * h * w * 2 * req.batch / GIB                    # bf16 RGB video
    pp = spec.parallel.vae_patch if spec.parallel.world_size > 1 else 1
    tiled = spec.memory.vae_tiling or pp > 1
    if tiled and (w > TILE_PX or h > TILE_PX):
        work = cal["vae_decode_tile_gib"]
        tiles_all = video * cal["tile_overlap"]
        if pp > 1:
            held = tiles_all / pp + ((tiles_all + video * cal["video_copies_tiled"]) if rank == 0 else video)
            how = (f"tiled ({TILE_PX}px tiles), tiles spread over {pp} ranks"
                   + (", gathered and blended here" if rank == 0 else ", the blended video broadcast here"))
        else:
            held = tiles_all + video * cal["video_copies_tiled"]
            how = f"tiled ({TILE_PX}px tiles), all tiles kept for blending"
        return work + held, how + f"; video {video:.2f} GiB", True
    work = px_coef * h * w * req.batch / GIB
    return work + video * cal["video_copies"], \
        f"untiled: one latent frame at a time at {w}x{h} (flat in frames); video {video:.2f} GiB " \
        "(VAE tiling shrinks this: Serving Config's vae_tiling, CLI --vae-tiling)", False


def _vae_encode_gib(req: RequestShape, spec: LaunchSpec, cal: dict[str, float],
                   pipeline: str) -> tuple[float, str]:
    """The encode phase's working set: the encoder's (per pixel of one frame, or one tile) plus the copies of
    the input video it holds. VACE holds more of them: the control video, its mask, and the inactive and
    reactive halves it encodes one after the other (pipeline_wan2_2_vace.py, prepare_video_latents)."""
    px_coef = cal["vae_encode_px_wan2.1"]
    w, h, f = req.width, req.height, req.frames
    video = 3 * f * h * w * 2 * req.batch / GIB
    copies = cal["vace_encode_video_copies"] if pipeline == "vace" else 2.0
    what = "the control video, its mask and both halves" if pipeline == "vace" else "the image + F-1 black frames"
    tiled = spec.memory.vae_tiling or (spec.parallel.vae_patch > 1 and spec.parallel.world_size > 1)
    if tiled and (w > TILE_PX or h > TILE_PX):
        return px_coef * TILE_PX * TILE_PX / GIB + copies * video, f"tiled encode of {what}"
    return px_coef * h * w * req.batch / GIB + copies * video, f"untiled encode of {what}"


def _host_ram(spec: LaunchSpec, sizes: ModelSizes, available: Optional[float], cal: dict[str, float]) -> dict[str, Any]:
    """Offload keeps pinned CPU copies: module offload of the swapped parts, layerwise of the DiT
    (and, on 0.30, of the text encoder's streamed blocks)."""
    experts = _loaded_experts(spec, sizes)
    wfrac = cal["fp8_weight_fraction"] if spec.memory.quantization == "fp8" else 1.0
    dit = sum(sizes.dit_gib(i) * wfrac for i in experts)
    ranks = spec.parallel.world_size
    if spec.memory.offload == "module":
        tp = spec.parallel.degree if spec.parallel.mode == "tensor" else 1
        need = (dit / tp + sizes.text_encoder_gib) * ranks
        what = "DiT experts and text encoder, per rank"
    else:
        streamed_te = sizes.text_encoder_gib * (1.0 - cal["layerwise_te_resident_fraction"])
        need = dit + streamed_te
        what = "the DiT blocks" + (" and the text encoder's blocks" if streamed_te > 0 else "")
    need += 4.0   # the server process itself (Python, CUDA host allocations)
    result: dict[str, Any] = {"needed_gib": round(need, 2), "what": what, "available_gib": None, "ok": None}
    if available == -1.0:
        try:
            import psutil  # lazy: planning for hypothetical GPUs works without it
            available = psutil.virtual_memory().available / GIB
        except Exception:
            available = None
            result["why_unknown"] = "psutil is not installed or could not read memory"
    if available is not None:
        result["available_gib"] = round(available, 2)
        result["ok"] = available >= need
    return result


def _general_notes(spec: LaunchSpec, req: RequestShape, family: WanFamily, notes: list[str],
                   server_version: Optional[tuple[int, int]]) -> None:
    line = calibrated_line(server_version)
    if line not in family.memory_measured_on:
        measured = ", ".join(f"{a}.{b}" for a, b in family.memory_measured_on)
        notes.append(f"UNCALIBRATED on vLLM-Omni {line[0]}.{line[1]}: the {family.label} estimate was checked "
                     f"against a real server on vLLM-Omni {measured} only (docs/wan-pipelines.md, section 7); "
                     "leave extra headroom")
    if spec.memory.vae_slicing and req.batch <= 1:
        notes.append("VAE slicing (--vae-slicing) splits only a batch; at batch 1 it saves nothing")
    if spec.memory.quantization == "fp8":
        notes.append("FP8 for Wan2.2 is not validated upstream (feature table: quantization not supported); "
                     "the estimate assumes linear weights at 1 byte")
    if spec.parallel.world_size > 1 and spec.parallel.vae_patch > 1 and not spec.memory.vae_tiling:
        # upstream: vllm_omni/diffusion/registry.py:475-480 (0.30) sets vae_use_tiling with patch parallel
        notes.append("VAE patch parallel (Serving Config's vae_patch_parallel, CLI --vae-patch) turns VAE tiling "
                     "on by itself")
    if spec.parallel.mode == "cfg" and not family_runs_cfg(family, req.cfg):
        notes.append("CFG parallel with CFG off (guidance 1) leaves the second GPU idle: use ulysses instead")
