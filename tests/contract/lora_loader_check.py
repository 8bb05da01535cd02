"""The REAL vLLM-Omni 0.30 LoRA loaders on CPU against a tiny Wan2.2 transformer (server side).

:func:`check` runs inside ``upstream_resolve.py`` (server python), which calls it by name for a
case ``{"call": "lora_loader_check:check", "input": {"model_dir": DIR, "out_dir": DIR}}``, so
the checks share the session's resolver process and its vLLM import instead of paying for one
of their own.  By hand::

    echo '[{"call": "lora_loader_check:check", "input": {"model_dir": "tests/contract/fixtures/lora/tiny-wan22-ti2v",
            "out_dir": "/tmp/lora-check"}}]' | python tests/contract/upstream_resolve.py

``model_dir`` holds ``transformer/config.json`` (and ``transformer_2/config.json`` for A14B):
the tiny random-weight Wan2.2 shapes (tests/contract/fixtures/lora/).  The check builds
vLLM-Omni's own ``WanTransformer3DModel`` for each expert from that config and loads it through
its own load_weights() (random weights: only the module names and shapes matter), writes a
ComfyUI-format LoRA per expert with bench/make_tiny_lora.py, and runs upstream's
fused-at-startup path, ``WanLoraLoaderMixin.load_lora_weights`` (diffusers' Wan converter,
vLLM-Omni's key remapping and its fusing into the parameters), recording which keys of each
file were applied.  It returns::

    {"experts": {"transformer": {"keys": N, "applied": N, "unmatched": [], "changed": K}, ...}}

The seams (there is no GPU), set up by :func:`single_process_groups` for the check only and put
back afterwards (the resolver's later cases run as before): a vLLM config on the CPU device,
torch.distributed on gloo with world size 1, vLLM-Omni's parallel groups of size 1 (torn down
with upstream's own ``destroy_distributed_env``), and the attention backend, which an
unspecified (CPU) platform cannot pick, set to upstream's own SDPA backend.  Nothing of the
loading code is replaced.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1] / "bench") not in sys.path:
    sys.path.insert(0, str(HERE.parents[1] / "bench"))

import torch  # noqa: E402

from make_tiny_lora import make_comfy_lora  # noqa: E402

SDPA = "vllm_omni.diffusion.attention.backends.sdpa.SDPABackend"


@contextlib.contextmanager
def patched(cls: type, name: str, value: object) -> Iterator[None]:
    """``cls.name = value`` while the block runs; afterwards what was there (own or inherited)."""
    missing = object()
    own = cls.__dict__.get(name, missing)
    setattr(cls, name, value)
    try:
        yield
    finally:
        if own is missing:
            delattr(cls, name)
        else:
            setattr(cls, name, own)


@contextlib.contextmanager
def single_process_groups() -> Iterator[None]:
    """Distributed state of a one-GPU worker on CPU while the block runs; none afterwards."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm_omni.diffusion.distributed.parallel_state import (destroy_distributed_env, init_distributed_environment,
                                                                initialize_model_parallel)
    import vllm_omni.platforms as platforms

    fd, store = tempfile.mkstemp(prefix="lora-check-")
    os.close(fd)
    os.unlink(store)          # gloo's file store creates it
    init = f"file://{store}"
    sdpa = classmethod(lambda cls, *a, **k: SDPA)
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))), \
            patched(type(platforms.current_omni_platform), "get_diffusion_attn_backend_cls", sdpa):
        torch.distributed.init_process_group("gloo", init_method=init, world_size=1, rank=0)
        try:
            init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=init,
                                         backend="gloo")
            initialize_model_parallel(backend="gloo")
            yield
        finally:
            destroy_distributed_env()           # upstream's teardown: its groups and torch's
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(store)


def transformer(config_dir: Path) -> torch.nn.Module:
    """vLLM-Omni's transformer for this config, loaded as the server loads it: its load_weights()
    reads a Diffusers checkpoint (here diffusers' own model of the config, random weights) and
    fuses self-attention q/k/v, which is also where it records the mapping the LoRA loader uses."""
    from diffusers import WanTransformer3DModel as DiffusersWan
    from vllm_omni.diffusion.models.wan2_2.wan2_2_transformer import WanTransformer3DModel

    config = json.loads((config_dir / "config.json").read_text())
    accepted = inspect.signature(WanTransformer3DModel.__init__).parameters
    kwargs = {k: (tuple(v) if k == "patch_size" else v) for k, v in config.items() if k in accepted}
    model = WanTransformer3DModel(**kwargs)
    checkpoint = DiffusersWan.from_config(DiffusersWan.load_config(str(config_dir))).state_dict()
    model.load_weights(iter(checkpoint.items()))
    return model


def check(spec: dict) -> dict:
    """Every key of a ComfyUI-format LoRA per expert of ``spec["model_dir"]``, through the real loader."""
    model_dir, out_dir = Path(spec["model_dir"]), Path(spec["out_dir"])
    with single_process_groups():
        return _applied_keys(model_dir, out_dir)


def _applied_keys(model_dir: Path, out_dir: Path) -> dict:
    from vllm_omni.diffusion.lora.loader import WanLoraLoaderMixin

    experts = [e for e in ("transformer", "transformer_2") if (model_dir / e / "config.json").is_file()]
    modules = {e: transformer(model_dir / e) for e in experts}
    files = [str(make_comfy_lora(model_dir, out_dir / f"{e}.safetensors", expert=e, seed=i))
             for i, e in enumerate(experts)]

    # The converter is looked up by the pipeline's class name, as for the real Wan22Pipeline.
    def init(self: object) -> None:
        for name, module in modules.items():
            setattr(self, name, module)

    pipeline = type("Wan22Pipeline", (WanLoraLoaderMixin,), {"has_transformer_2": len(experts) == 2,
                                                            "__init__": init})()
    applied: list[tuple[set[str], set[str]]] = []
    real = WanLoraLoaderMixin.load_lora_into_module.__func__

    def recording(cls: type, state_dict: dict, module: torch.nn.Module, **kwargs: object) -> set[str]:
        keys = real(cls, state_dict, module, **kwargs)
        applied.append((set(state_dict), set(keys)))
        return keys

    before = {e: {n: p.detach().clone() for n, p in m.named_parameters()} for e, m in modules.items()}
    with patched(WanLoraLoaderMixin, "load_lora_into_module", classmethod(recording)):   # records, calls upstream's
        pipeline.load_lora_weights(files, adapter_name="check")
    report = {}
    for (expert, module), (keys, used) in zip(modules.items(), applied):
        changed = sum(1 for n, p in module.named_parameters() if not torch.equal(before[expert][n], p.detach()))
        report[expert] = {"keys": len(keys), "applied": len(used), "unmatched": sorted(keys - used),
                          "changed": changed}
    return {"experts": report}
