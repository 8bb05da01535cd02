"""The stub server's fake GPU: a ``DiffusionExecutor`` whose workers are simulated in-process.

See ``stub_vllm_serve.py`` (the entry point) for what it emulates and why; imported by it after
vLLM is loaded and the fake Hub and device inventory are installed.
"""
from __future__ import annotations

import logging
import os
import time

import frame_code
import numpy as np
import torch
import upstream
from stub_serve_faults import Faults
from stub_serve_knobs import ARGV, KNOBS
from stub_serve_model_facts import ModelFacts
from stub_serve_worker_log import WorkerLog
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_omni.diffusion.data import DiffusionOutput
from vllm_omni.diffusion.executor.abstract import DiffusionExecutor
from vllm_omni.diffusion.media import (
    DiffusionMediaOutput,
    VideoMediaOutput,
    VideoTensorEncoding,
    VideoTensorLayout,
    VideoTensorSpec,
    VideoValueRange,
)

GiB = 1 << 30
CUDA_OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.55 GiB of which "
    "1.02 GiB is free. Including non-PyTorch memory, this process has 22.52 GiB memory in use. Of the "
    "allocated memory 21.80 GiB is allocated by PyTorch, and 312.45 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
INVALID_DEVICE_MESSAGE = (
    "CUDA error: invalid device ordinal\n"
    "GPU device may be out of range, do you have enough GPUs?\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


class _Stalled(Exception):
    pass


class StubGpuExecutor(DiffusionExecutor):
    """A ``DiffusionExecutor`` whose workers are simulated in-process (see module doc)."""

    uses_multiproc = False
    upstream_class: type | None = None  # set by upstream.install_executor

    # -- lifecycle --------------------------------------------------------------------
    def _init_executor(self) -> None:
        od = self.od_config
        real = type(self).upstream_class
        self._closed = False
        self._is_failed = False
        self._failure_callbacks: list = []
        self.world_size = int(od.parallel_config.world_size)
        real_name = getattr(real, "__name__", "")
        num_gpus = od.num_gpus or 1
        if real_name == "UniProcDiffusionExecutor" and num_gpus != 1:
            # UniProcDiffusionExecutor._init_executor rejects this before creating its worker.
            raise ValueError(
                f"UniProcDiffusionExecutor supports a single GPU only, got num_gpus={num_gpus}. "
                'Use distributed_executor_backend="mp" for multi-GPU deployments.'
            )
        self.separate_workers = bool(getattr(real, "uses_multiproc", False)) or real_name.startswith("Multiproc")
        self.log = WorkerLog(self.separate_workers)
        self.facts = ModelFacts.load(od)
        self.devices = upstream.stage_devices(self.world_size)
        missing = upstream.missing_devices(self.world_size)
        if missing:
            # What torch.cuda.set_device() raises in a worker bound to a GPU the machine lacks.
            raise torch.AcceleratorError(INVALID_DEVICE_MESSAGE)
        self._load_workers()

    def _load_workers(self) -> None:
        od, log, facts = self.od_config, self.log, self.facts
        ranks = range(self.world_size) if self.separate_workers else range(1)
        for rank in ranks:
            log.emit("worker_initialized", logging.INFO, rank)
        t0 = time.perf_counter()
        if facts.is_wan:
            from vllm_omni.diffusion.model_loader.hub_prefetch import prefetch_subfolders

            prefetch_subfolders(od.model, ["tokenizer", "text_encoder", "vae"],
                                local_files_only=os.path.exists(od.model))
        if KNOBS.oom_at_load_now(ARGV):
            # A weight tensor allocation on the device fails during load_model().
            raise torch.OutOfMemoryError(CUDA_OOM_MESSAGE)
        t_weights = time.perf_counter()
        self._shard_progress(facts.num_shards)
        if KNOBS.load_delay_s > 0:
            time.sleep(KNOBS.load_delay_s)
        gib = facts.gpu_bytes(od, self.world_size) / GiB
        for rank in ranks:
            log.emit("weights_loaded", logging.INFO, time.perf_counter() - t_weights)
            log.emit("model_loaded_size", logging.INFO, gib, time.perf_counter() - t0)
            log.emit("model_loaded", logging.INFO)
            if not getattr(od, "enforce_eager", False):
                for attr in facts.transformers:
                    log.emit("lazy_compile", logging.INFO,
                             attr, getattr(od, "diffusion_compile_granularity", "regional"),
                             getattr(od, "diffusion_compile_dynamic", True))
            log.emit("runner_ready", logging.INFO)
            log.emit("worker_ready", logging.INFO, rank)

    def _shard_progress(self, shards: int) -> None:
        from tqdm import tqdm
        from vllm.model_executor.model_loader.weight_utils import _BAR_FORMAT

        with tqdm(total=shards, desc="Multi-thread loading shards", bar_format=_BAR_FORMAT,
                  file=self.log.raw_stderr()) as bar:
            for _ in range(shards):
                bar.update()

    @property
    def is_dead(self) -> bool:
        return self._closed or self._is_failed

    def register_failure_callback(self, callback) -> None:
        self._failure_callbacks.append(callback)

    def mark_failed(self) -> None:
        if self._is_failed:
            return
        self._is_failed = True
        for callback in list(self._failure_callbacks):
            try:
                callback()
            except Exception:
                pass

    def check_health(self) -> None:
        if self._is_failed:
            raise EngineDeadError()
        if self._closed:
            raise RuntimeError("DiffusionExecutor is closed.")

    def shutdown(self) -> None:
        self._closed = True

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, unique_reply_rank=None,
                       exec_all_ranks=False):
        if self._closed:
            raise RuntimeError("DiffusionExecutor is closed.")
        results = {"list_loras": [], "add_lora": True, "remove_lora": True, "pin_lora": True,
                   "synchronize_device": None, "profile": None}
        if method not in results:
            raise NotImplementedError(f"stub GPU executor does not implement collective_rpc({method!r})")
        result = results[method]
        return result if unique_reply_rank is not None else [result] * (self.world_size if exec_all_ranks else 1)

    # -- execution --------------------------------------------------------------------
    def execute_request(self, scheduler_output):
        from vllm_omni.diffusion.worker.utils import BatchRunnerOutput, RunnerOutput

        if self._closed:
            raise RuntimeError("DiffusionExecutor is closed.")
        outputs = []
        for new_req in scheduler_output.scheduled_new_reqs:
            outputs.append(RunnerOutput(request_id=new_req.request_id, step_index=None, finished=True,
                                        result=self._run_request(new_req.req)))
        return BatchRunnerOutput.from_list(outputs)

    execute_batch = execute_request

    def execute_step(self, scheduler_output):
        raise RuntimeError("stub GPU executor: Wan pipelines have no step execution")

    def _run_request(self, req) -> DiffusionOutput:
        dummy = req.is_dummy_run()
        job = None if dummy else Faults.job_started()
        try:
            media, peak = self._forward(req, job)
        except _Stalled:
            return DiffusionOutput(error="DiffusionEngine is closed.")
        except Exception as exc:
            # UniProcDiffusionExecutor.execute_request: the worker's exception becomes the
            # request's error output (the engine then raises it as RuntimeError).
            return DiffusionOutput(error=str(exc))
        if not dummy:
            Faults.engine_finished(req.request_id, self)
        if isinstance(media, list):       # the worker-side MP4's bytes: the pipeline's legacy output (see _forward)
            return DiffusionOutput(output=media, peak_memory_mb=peak)
        return DiffusionOutput(media=media, peak_memory_mb=peak)

    def _forward(self, req, job: int | None):
        from vllm_omni.diffusion.models.progress_bar import ProgressBarMixin
        from vllm_omni.diffusion.postprocess.device_reduction import prepare_diffusion_media_for_transport

        facts, od, sp = self.facts, self.od_config, req.sampling_params
        prompt = req.prompt
        text = prompt if isinstance(prompt, str) else (prompt.get("prompt") or "")
        height = sp.height or 480
        width = sp.width or 832
        num_frames = sp.num_frames or 81
        steps = 40 if sp.num_inference_steps is None else sp.num_inference_steps
        if facts.is_wan:
            from vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2 import (
                resolve_wan_flow_shift,
                resolve_wan_guidance_scales,
                resolve_wan_sample_solver,
            )

            if not text:
                raise ValueError("Prompt is required for Wan2.2 I2V generation when prompt_embeds are not provided."
                                 if facts.is_i2v else
                                 "Prompt is required for Wan2.2 generation when prompt_embeds are not provided.")
            if facts.is_i2v:
                mm = {} if isinstance(prompt, str) else (prompt.get("multi_modal_data") or {})
                if mm.get("image") is None:
                    raise ValueError("Image is required for I2V generation.")
                if height % 16 != 0 or width % 16 != 0:
                    raise ValueError(f"`height` and `width` have to be divisible by 16 but are {height} and {width}.")
            else:
                mod = facts.spatial * facts.patch
                height, width = height // mod * mod, width // mod * mod
            if facts.is_dmd:
                steps = 3
            resolve_wan_guidance_scales(sp, default_guidance_scale=5.0 if facts.is_i2v else 4.0)
            if od.boundary_ratio is None and sp.boundary_ratio is None:
                self.log.emit("boundary_ratio_i2v" if facts.is_i2v else "boundary_ratio_t2v", logging.WARNING)
            if num_frames % facts.temporal != 1:
                num_frames = num_frames // facts.temporal * facts.temporal + 1
            num_frames = max(num_frames, 1)
            if not facts.is_dmd:
                resolve_wan_sample_solver(req)
                resolve_wan_flow_shift(req, od)
        # The Wan pipelines read extra_params.preencode_mp4 before the denoise (pipeline_wan2_2.py:725,
        # _i2v.py:521), refusing frame interpolation or another output_type there.
        preencode = facts.is_wan and _preencode(sp)
        if height <= 0 or width <= 0:
            raise RuntimeError(f"Calculated latent size is zero for height={height}, width={width}")
        seed = sp.seed if sp.seed is not None else 0
        batch = max(1, int(getattr(sp, "num_outputs_per_prompt", None) or 1))

        bar_owner = ProgressBarMixin()
        bar_owner.set_progress_bar_config(file=self.log.raw_stderr())
        per_request = getattr(sp, "extra_args", None) or {}   # the request's extra_params
        stall_at = min(1, steps - 1) if job is not None and (KNOBS.hang_in_job or per_request.get("stub_hang")) \
            else None
        oom_at = steps // 2 if job is not None and (KNOBS.oom_in_job == job or per_request.get("stub_oom")) \
            else None
        with bar_owner.progress_bar(total=steps) as pbar:
            for step in range(steps):
                if stall_at is not None and step == stall_at:
                    pbar.refresh()  # the last finished step stays on screen, then nothing
                    while not self._closed:
                        time.sleep(0.05)
                    raise _Stalled()
                if oom_at is not None and step == oom_at:
                    raise torch.OutOfMemoryError(CUDA_OOM_MESSAGE)
                if KNOBS.step_s > 0:
                    time.sleep(KNOBS.step_s)
                if self._closed:
                    raise _Stalled()
                pbar.update()

        frames = np.stack([frame_code.encode(i, seed, width, height) for i in range(num_frames)])
        video = torch.from_numpy(frames).permute(3, 0, 1, 2).unsqueeze(0).float().div_(127.5).sub_(1.0)
        video = video.to(torch.bfloat16).expand(batch, -1, -1, -1, -1).contiguous()
        peak_mb = (self.facts.gpu_bytes(od, self.world_size) + video.numel() * 8) / (1 << 20)
        if preencode:
            return _worker_mp4(video, sp), peak_mb
        media = DiffusionMediaOutput(video=VideoMediaOutput(
            tensor=video,
            spec=VideoTensorSpec(layout=VideoTensorLayout.BCTHW, encoding=VideoTensorEncoding.NORMALIZED_FLOAT,
                                 value_range=VideoValueRange.NEGATIVE_ONE_TO_ONE),
        ))
        return prepare_diffusion_media_for_transport(media, od_config=od, sampling_params=sp), peak_mb


def _preencode(sp) -> bool:
    from vllm_omni.diffusion.models.wan2_2.chunked_mp4 import resolve_wan_preencode_mp4

    return resolve_wan_preencode_mp4(sp, output_type=sp.output_type or "np")


def _worker_mp4(video: torch.Tensor, sp) -> list[bytes]:
    """The worker-side MP4 as the real Wan pipeline makes it (``decode_to_mp4``, pipeline_wan2_2.py:981-988): the
    clip's temporal chunks as the Wan VAE publishes them (1 frame, then 4 per latent frame) through upstream's own
    ``ChunkedVideoMP4Session`` with the request's fps, batching and codec options; one MP4 per batch entry."""
    from vllm_omni.diffusion.models.wan2_2.chunked_mp4 import (
        resolve_wan_output_fps,
        resolve_wan_preencode_batch_frames,
        resolve_wan_video_codec_options,
    )
    from vllm_omni.diffusion.utils.chunked_video import ChunkedVideoMP4Session

    session = ChunkedVideoMP4Session(value_range=(-1.0, 1.0), fps=resolve_wan_output_fps(sp),
                                     batch_frames=resolve_wan_preencode_batch_frames(sp),
                                     video_codec_options=resolve_wan_video_codec_options(sp))
    try:
        for start in [0, *range(1, video.shape[2], 4)]:
            session.push(video[:, :, start:(1 if start == 0 else start + 4)].float())
        return session.finish()
    except BaseException:
        session.abort()
        raise
