"""The memory planner's coefficients (planner/memory.py): each value, what it is, and what fixed it.

What was measured rather than derived: the VAE decode coefficients in `CALIBRATION`
(isolated decode on an H200, bench/memory); TI2V-5B's per-token activation term and the tiled
decode carry (NVML peaks of the real server on an H200, bench/memory/results/
h200-ti2v5b-vllm-omni-0.26.json, checked by tests/unit/test_plan_calibration.py); A14B's per-token coefficients and the allocator
slack/carry/workspace terms are fitted to vLLM-Omni's published peaks (`max_memory_reserved`,
in MiB) and the H200 runs (docs/upstream-facts.md, "Published memory peaks" and "H200
measurements"); tests/unit/test_plan_memory.py checks each.
"""
from __future__ import annotations

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
    "tile_overlap": (256 / 192) ** 2,
    "video_copies_tiled": 4.50 - (256 / 192) ** 2,
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
    # FP8: linear weights at 1 byte, the rest (norms, embeddings, modulation) stays bf16.
    "fp8_weight_fraction": 0.52,
    # Safety margin a plan keeps free on every GPU: fraction of the card, and at least this.
    "margin_fraction": 0.03,
    "margin_min_gib": 0.5,
}
TILE_PX = 256            # diffusers AutoencoderKLWan tile_sample_min_height/width
TILE_STRIDE_PX = 192     # tile_sample_stride
