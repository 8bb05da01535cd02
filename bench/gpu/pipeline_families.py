"""The issue-30 pipelines on the GPU bench (`--pipeline`): VACE 14B / 1.3B, speech-to-video 14B, FastWan TI2V-5B.

Ours only (there is no ComfyUI-native twin of these graphs in the head-to-head): each runs our template from
workflows/ through a real ComfyUI against a real server, with random weights at real size laid out as the real
repo is (bench/gpu/pipeline_manifest.py says where every shape comes from). One record per pipeline, read by
pipeline_manifest.py (shapes), pipeline_weights.py (files, disk plan) and pipeline_run.py (graphs, shapes).

Shapes: the template's own (its widgets at 0 take the family's defaults, VACE's take the control video's, which
the template scales to 832x480 and trims to 81 frames) and one held-out shape the planner's fit never saw, larger
in latent tokens than the template's so the allocator's pool from the template jobs cannot stand in for its peak.
S2V's frames are per clip (the clip count follows the 3 s of audio: one clip either way).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
FIXTURES = HERE.parents[1] / "tests" / "contract" / "fixtures" / "hf"   # the real repos' config files


@dataclass(frozen=True)
class Pipeline:
    """One issue-30 pipeline on the bench."""

    name: str                    # the bench's name (--pipeline)
    family: str                  # models/families.py PIPELINE_FAMILIES key
    layout: str                  # "diffusers" (model_index.json + subfolders) | "s2v-original" (Wan's own files)
    template: str                # workflows/api/<template>.api.json
    fixture: str                 # the real repo's configs under tests/contract/fixtures/hf (S2V: config.json only)
    shape: tuple[int, int, int]  # width, height, frames (S2V: frames per clip) of the template
    held_out: tuple[int, int, int]
    transformer: dict            # config updates over the fixture's transformer config (VACE-14B: its own sizes)
    step_guess_s: float          # s/step assumed before one is measured (H100/H200, CFG on)
    first_s: float               # seconds a first job takes beyond its steps (server start: load, warm-up)

    @property
    def folder(self) -> str:
        return f"{self.name}-fullsize"          # under <base>/models/diffusers: Load Wan Pipeline Model's local/

    @property
    def manifest(self) -> Path:
        return HERE / f"manifest_{self.name.replace('-', '_').replace('.', '_')}.json"


# Wan2.1 VACE-14B's transformer: Wan2.1 14B (40 layers of 40 x 128 heads, ffn 13824) with a VACE block on every
# 5th layer (docs/wan-pipelines.md, section 3: Wan-AI/Wan2.1-VACE-14B-diffusers transformer/config.json); the
# rest of its config is the 1.3B repo's (the fixture), which has the same keys.
VACE_14B_TRANSFORMER = dict(num_attention_heads=40, ffn_dim=13824, num_layers=40, vace_layers=list(range(0, 40, 5)))
# Wan2.2-S2V-14B's config.json keys the fixture leaves out, as the released checkpoint has them (its state dict
# has no motioner.* and no zip_motion_out.*: 1260 tensors); vLLM-Omni's class refuses framepack + motioner.
S2V_CONFIG_EXTRA = dict(enable_motioner=False, framepack_drop_mode="padd", add_last_motion=True,
                        trainable_token_pos_emb=False)

PIPELINES = {p.name: p for p in (
    Pipeline("vace-14b", "vace_14b", "diffusers", "wan21_vace_control_video", "Wan-AI/Wan2.1-VACE-1.3B-diffusers",
             (832, 480, 81), (1280, 720, 49), VACE_14B_TRANSFORMER, 6.5, 150.0),
    Pipeline("vace-1.3b", "vace_1_3b", "diffusers", "wan21_vace_control_video", "Wan-AI/Wan2.1-VACE-1.3B-diffusers",
             (832, 480, 81), (1280, 720, 49), {}, 1.0, 60.0),
    Pipeline("s2v-14b", "s2v_14b", "s2v-original", "wan22_s2v_speech_to_video", "Wan-AI/Wan2.2-S2V-14B",
             (832, 448, 80), (1024, 576, 48), S2V_CONFIG_EXTRA, 7.0, 150.0),
    Pipeline("fastwan-ti2v-5b", "fastwan_ti2v_5b", "diffusers", "fastwan_ti2v_5b_fast_text_to_video",
             "FastVideo/FastWan2.2-TI2V-5B-FullAttn-Diffusers", (1280, 704, 121), (1536, 864, 97), {}, 3.0, 90.0),
)}


def pipeline(name: str) -> Pipeline:
    return PIPELINES[name]


def latent_tokens(p: Pipeline, shape: tuple[int, int, int]) -> int:
    """Tokens after the VAE and the 1x2x2 patch (S2V: the clip plus its 73 motion frames, as the pipeline
    packs them), to order shapes: the held-out one must be the larger."""
    w, h, f = shape
    spatial = 16 if p.family == "fastwan_ti2v_5b" else 8
    frames = f + 3 + 73 if p.layout == "s2v-original" else f
    return ((frames - 1) // 4 + 1) * (h // spatial // 2) * (w // spatial // 2)


# Disk: what one machine holds (64 GiB disk; the kit pieces, the unpacked kit and the two venvs take ~15 GiB). A
# 14B pipeline's files take 44-46 GiB, so only one of them is on disk at a time: build, run, delete (`pclean`).
DISK_GIB, KIT_AND_VENVS_GIB = 64.0, 15.0
# The device session's order: each group is built, run and removed before the next (the README's calls);
# VACE-1.3B and FastWan share the UMT5 file and fit together.
DEVICE_ORDER = (("s2v-14b",), ("vace-14b",), ("vace-1.3b", "fastwan-ti2v-5b"))


def disk_order(footprints: dict[str, tuple[float, float]], free_gib: float = DISK_GIB - KIT_AND_VENVS_GIB
               ) -> list[list[str]]:
    """Pipelines grouped, in the order given, into what can be on disk together: `footprints` maps a name to
    (GiB of its own files, GiB of the text encoder it shares with the other Diffusers pipelines: written once
    while any of them is on disk); a group's files stay within `free_gib` less a 1 GiB margin. A new group
    starts once the last one's pipelines are removed (`pipeline-weights --remove`)."""
    groups: list[list[str]] = []
    own = shared = 0.0
    for name, (mine, common) in footprints.items():
        if mine + common + 1.0 > free_gib:
            raise ValueError(f"{name}: {mine + common:.1f} GiB does not fit {free_gib:.1f} GiB")
        if groups and own + mine + max(shared, common) + 1.0 <= free_gib:
            groups[-1].append(name)
            own, shared = own + mine, max(shared, common)
        else:
            groups.append([name])
            own, shared = mine, common
    return groups

