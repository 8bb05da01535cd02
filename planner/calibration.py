"""The memory planner's coefficients (planner/memory.py), per vLLM-Omni line: each value, what it is, and what fixed it.

`CALIBRATION` is the 0.26 set (the first one fitted); `CALIBRATION_0_30` is what changes on 0.30,
measured through our Supervisor on an H200 (bench/results/h200-memory-vllm-omni-0.30/, the points in
bench/memory/results/h200-ti2v5b-vllm-omni-0.30.json, checked by tests/unit/test_memory_model_0_30.py).
`calibration_for(version)` picks the set for a server line; the pinned default (0.30) when unknown.

What was measured rather than derived: the VAE decode coefficients in `CALIBRATION`
(isolated decode on an H200, bench/memory); TI2V-5B's per-token activation term and the tiled
decode carry (NVML peaks of the real server on an H200, bench/memory/results/
h200-ti2v5b-vllm-omni-0.26.json, checked by tests/unit/test_plan_calibration.py); A14B's per-token coefficients and the allocator
slack/carry/workspace terms are fitted to vLLM-Omni's published peaks (`max_memory_reserved`,
in MiB) and the H200 runs (docs/upstream-facts.md, "Published memory peaks" and "H200
measurements"); tests/unit/test_plan_memory.py checks each.
"""
from __future__ import annotations

from typing import Optional

from ..server.launch.versions import DEFAULT_VERSION

TILE_PX = 256            # diffusers AutoencoderKLWan tile_sample_min_height/width
TILE_STRIDE_PX = 192     # tile_sample_stride_height/width: neighbouring tiles overlap by TILE_PX - this

# Calibration. Each value: what it is, and what fixed it.
CALIBRATION: dict[str, float] = {
    # DiT activation working set per token, in bf16 hidden vectors (hidden x 2 bytes).
    # Fitted to the published I2V-A14B peaks (docs/upstream-facts.md, "Published memory
    # peaks"): the 2-GPU
    # 480p -> 720p/121 step (16,380 -> 55,800 tokens per rank, +9.4 GiB) sets the slope.
    "act_units": 23.3,
    # TI2V-5B's own figure (the modulation below comes on top), MEASURED: fitted to the NVML peaks
    # of the real 0.26 server on an H200, first job of each server, --vae-use-tiling alone / +
    # layerwise / + module offload at 1280x704x121 (bench/memory/results/h200-ti2v5b-vllm-omni-0.26.json).
    # With 23.3 those were over-predicted by 16-25%; with 13 every valid point is within -3..+2%.
    # 13 + 24 = 37 units is the CPU layer's 34.3 allocated units plus ~8% allocator rounding; A14B's
    # 23.3 (about twice its CPU layer) stays fitted to upstream's published peaks.
    "act_units_ti2v_5b": 13.0,
    # Of those, the part that tensor parallel does not split (residual stream, norms).
    "act_units_replicated": 5.0,
    # (On CPU, one real-width diffusers layer allocates 11.5-12.1 units for A14B at 3,120 and
    # 7,200 tokens: bench/memory/results/cpu-dit-frames5.json. The GPU figure is reserved
    # memory, with allocator slack and FlashAttention/compile workspaces.)
    # TI2V-5B (expand_timesteps): the per-token timestep modulation, 6 x hidden in fp32,
    # plus the (table + temb) sum: 2 x 6 x hidden x 4 bytes = 24 bf16 hidden units
    # (vllm-omni wan2_2_transformer.py:744-754; the CPU layer measures 34.3 units in all,
    # 22-23 above A14B's).
    "temb_units_ti2v": 24.0,
    # VAE decode, MEASURED on an H200 (bench/memory/results/h200-vae-decode.json: real Wan2.1 /
    # Wan2.2 VAE architectures, random bf16 weights, diffusers 0.38, torch 2.11; reserved bytes
    # above weights + latent). Untiled, the decode runs one latent frame at a time (causal chunks),
    # so its working set grows with H x W only: per output pixel of one frame, bytes, per VAE kind
    # (minimax over 832x480 and 1280x720/704 at 81 and 121 frames; every point within 3.2%).
    "vae_decode_px_wan2.1": 16230.0,
    "vae_decode_px_wan2.2": 18020.0,
    # What grows with frames untiled: the decoded video, one bf16 copy (allocated peak grows by
    # exactly one video from 81 to 121 frames; the reserved peak not at all, the slack absorbs it).
    "video_copies": 1.0,
    # Tiled (256-px tiles, stride 192): a tile's working set (GiB, fitted intercept) plus all
    # decoded tiles kept for blending ((256/192)^2 overlap) plus the blended/concatenated/clamped
    # copies of the video (fitted slope 4.50 videos in all, minus the overlap). Every measured
    # tiled point within 7.1%.
    "vae_decode_tile_gib": 0.69,
    "tile_overlap": (TILE_PX / TILE_STRIDE_PX) ** 2,
    "video_copies_tiled": 4.50 - (TILE_PX / TILE_STRIDE_PX) ** 2,
    # In the server the decode runs after the denoise, in an allocator already carved up by it:
    # the H200 "memory after job" (docs/upstream-facts.md, "H200 measurements") is 24.3 GiB
    # above weights + context for
    # T2V-A14B 1280x720x81 and 24.0 GiB for TI2V-5B 1280x704x121, where the isolated decode
    # reserves 14.4 and 15.6 GiB. The difference (0.69 and 0.53 of the decode) is allocator slack
    # the decode leaves reserved in a long-running process: blocks of the denoise that
    # empty_cache() cannot return (segments still holding a live tensor: latents, prompt
    # embeddings, scheduler state) and the decode's per-chunk sizes not fitting those cached
    # blocks, so it maps new segments (inferred, not measured inside the server). Counted as a
    # fraction of the measured decode (fitted 0.6; tiled too: it brings the five tiled
    # patch-parallel after-job points closer, -0.2% to -5.1%);
    # it is reserved, not used, so it matters for what the GPU must have free.
    "decode_server_slack": 0.6,
    # The same for a tiled decode (0.26: one value for both; 0.30 keeps it for tiles only).
    "decode_server_slack_tiled": 0.6,
    # I2V condition encode (Wan2.1 VAE encoder at full resolution), bytes per pixel: assumed 60%
    # of the 27 KB/px decode figure the after-job fit used to imply (no number isolates it yet;
    # bench/memory `--only vae_encode` measures it). Kept conservative until that run is folded in.
    "vae_encode_px_wan2.1": 16000.0,
    # Part of what the decode leaves reserved (decode + decode_server_slack) that stays into the
    # next request's denoise (nothing empties the cache after a request). Fitted: with 0.5 the
    # 1xH100 480p peak lands within 3% (without it -6%); unchanged by the measured decode since
    # decode + slack there (9.9 GiB) is close to the old fitted decode (10.6 GiB).
    "decode_carry": 0.5,
    # A tiled decode leaves video-sized blocks that the next denoise reuses: MEASURED on the H200
    # (same file): an 832x480x49 layerwise job after a 1280x704x121 one started with that job's
    # decode blocks reserved (18.89 GiB) and peaked only 0.30 GiB above them. So no carry is added.
    "decode_carry_tiled": 0.0,
    # Communication workspace kept in the allocator by a parallel mode (all-to-all and
    # all-gather buffers), GiB per rank. Ulysses+HSDP fitted to the 2xH100 peaks (5.2 GiB
    # beyond the gathered blocks); CFG and Ulysses alone to the H200 after-job memory.
    "workspace_ulysses": 3.0,
    "workspace_ring": 3.0,
    "workspace_cfg": 1.5,
    "workspace_tensor": 1.5,
    # (HSDP refitted from 2.2 when the tiled carry went to 0: the two Ulysses+HSDP+VAE-patch
    # points, which decode tiled, had absorbed that carry; now +0.5% / -0.6%.)
    "workspace_hsdp": 3.7,
    # Outside PyTorch's allocator: CUDA context, cuBLAS/cuDNN workspaces, FlashAttention.
    "cuda_context_gib": 0.75,
    # NCCL communicators and buffers per rank when the world has > 1 GPU.
    "nccl_gib": 0.75,
    # HSDP (FSDP2) gathers a block before running it and prefetches the next one.
    "hsdp_gathered_blocks": 2.0,
    # Layerwise offload keeps about this many blocks per expert on the GPU (current + prefetch).
    "layerwise_resident_blocks": 2.0,
    # Share of the text encoder that layerwise offload keeps on the GPU: on 0.26 all of it (only DiT
    # blocks are streamed).
    "layerwise_te_resident_fraction": 1.0,
    # FP8: linear weights at 1 byte, the rest (norms, embeddings, modulation) stays bf16.
    "fp8_weight_fraction": 0.52,
    # The pipelines beyond plain Wan2.2 (docs/wan-pipelines.md), MEASURED on vLLM-Omni 0.30 through our nodes
    # on one H100 (real-size random weights, NVML peak of each job less ComfyUI's own context:
    # bench/results/h100-wan-pipelines-vllm-omni-0.30/, checked by tests/unit/test_memory_model_pipelines_0_30.py);
    # the 0.26 line uses the same values unmeasured (its plans for these families say UNCALIBRATED).
    # VACE's context encode holds the control video, its mask (all ones without one), and the inactive and
    # reactive halves, in bf16 and fp32: fitted 11.4 bf16 videos on VACE-1.3B at 832x480x81 (where the encode
    # sets the peak); its held-out 1280x720x49 is then -1.4%, VACE-14B (peak in the denoise, with the VACE hints
    # term) +1.8% / +6.0%. S2V-14B (its loader's second token embedding counted: planner/model_sizes.py) and
    # FastWan need nothing of their own: +1.5% / +1.1% and +3.5% / +3.7%.
    "vace_encode_video_copies": 11.4,
    # Safety margin a plan keeps free on every GPU: fraction of the card, and at least this.
    "margin_fraction": 0.03,
    "margin_min_gib": 0.5,
}


# vLLM-Omni 0.30, MEASURED (H200, TI2V-5B full size, eager, 4 steps; NVML peak of each job against
# plan(): bench/memory/results/h200-ti2v5b-vllm-omni-0.30.json). Only what differs from 0.26:
CALIBRATION_0_30: dict[str, float] = dict(
    CALIBRATION,
    # The decode leaves no slack beyond the isolated decode: without offload the untiled peak is the
    # loaded weights + CUDA context + the isolated decode (18,020 bytes per output pixel of one frame)
    # + the video, within 1% at 832x480, 1024x576 and 1280x704 (0.26 kept 0.6 of the decode on top).
    # A tiled decode still leaves 0.6 of its working set reserved beyond it (its many tile-sized
    # blocks): without it the tiled small-shape peaks (layerwise + tiling 832x480x49/81) came out
    # 8-11% low, with it every tiled point is within 5%.
    decode_server_slack=0.0,
    # 0.30 streams the text encoder's blocks too under layerwise offload (the Wan2.2 pipeline declares
    # encoder_block_attrs {"text_encoder": "encoder.block"}): about 0.7 GiB stays of UMT5-XXL's 10.6 (its
    # 2 GiB token embedding is not a block and stays: fitted 0.22 of the encoder; the whole process
    # holds ~7 GiB after load where 0.26 held the encoder's 10.6 GiB on top).
    layerwise_te_resident_fraction=0.22,
)
CALIBRATIONS: dict[tuple[int, int], dict[str, float]] = {(0, 26): CALIBRATION, (0, 30): CALIBRATION_0_30}


def calibrated_line(version: Optional[tuple[int, int]]) -> tuple[int, int]:
    """The vLLM-Omni line whose coefficients a plan for `version` uses: the newest calibrated one not
    newer than it (0.26 for anything before 0.30); the pinned default (0.30) when `version` is None."""
    if version is None:
        return DEFAULT_VERSION
    known = [v for v in sorted(CALIBRATIONS) if v <= tuple(version)]
    return known[-1] if known else min(CALIBRATIONS)


def calibration_for(version: Optional[tuple[int, int]]) -> dict[str, float]:
    """The coefficient set of a vLLM-Omni line (`calibrated_line`)."""
    return CALIBRATIONS[calibrated_line(version)]


def calibration_label(version: Optional[tuple[int, int]]) -> str:
    """How a plan names what it was calibrated for: 'vLLM-Omni 0.30', and when the server's version
    was not known, that this is the pinned default."""
    major, minor = calibrated_line(version)
    return f"vLLM-Omni {major}.{minor}" + ("" if version else " (the pinned default: the server's version is unknown)")
