"""Failure classification: each known server failure names what to change and keeps the raw tail."""
from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni_launcher.client.http_errors import OOM_FIX, job_failed_error
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.logs.failures import Context, classify

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
TRACEBACK = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>']

CASES = [
    # (last log line, ever_ready, kind, setting, words the user must see)
    ("--omni flag requires a valid instance of vllm-omni to be installed.", False, failures.OMNI_MISSING,
     "server_env", ["not installed", "python -m vllm_omni_launcher setup"]),
    ("ValueError: Stage 0 requires 2 device(s) based on parallel_config, but 1 device(s) are available: [0]",
     False, failures.DEVICES, "parallel_degree", ["needs 2 GPU(s)", "only 1"]),
    ("ValueError: Access to model Wan-AI/Wan2.2-T2V-A14B-Diffusers is restricted. You must have access to it",
     False, failures.GATED, "model", ["HF_TOKEN", "license"]),
    ("huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not Found for url",
     False, failures.MODEL_NOT_FOUND, "model", ["could not find the model"]),
    ("ValueError: Model foo did not resolve to a registered Omni pipeline or a supported diffusion model.",
     False, failures.MODEL_NOT_FOUND, "model", ["model_index.json"]),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of "
     "79.19 GiB of which 1.50 GiB is free.", False, failures.OOM_LOAD, "offload",
     ["while loading", "offload", "tried to allocate 20.00 GiB on GPU 0: 1.50 GiB free of 79.19 GiB"]),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", True, failures.OOM_JOB,
     "vae_tiling", ["during a job", "vae_tiling", "--parallel ulysses=2"]),
    ("OSError: [Errno 98] Address already in use", False, failures.PORT_IN_USE, "port", ["already in use"]),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
     False, failures.NCCL, "parallel_mode", ["NCCL", "NCCL_NVLS_ENABLE=0"]),
    ("ModuleNotFoundError: No module named 'diffusers'", False, failures.IMPORT_ERROR, "server_env",
     ["No module named 'diffusers'", "python -m vllm_omni_launcher setup"]),
    ("ImportError: cannot import name 'Foo' from 'vllm.bar'", False, failures.IMPORT_ERROR, "server_env",
     ["cannot import name"]),
    ("vllm serve: error: unrecognized arguments: --model-type wan2_2", False, failures.BAD_ARGS, "extra_flags",
     ["--model-type wan2_2", "remove the flag"]),
    ("ValueError: HSDP (FSDP2) is not compatible with TP", False, failures.CONFIG, "parallel_mode",
     ["HSDP (FSDP2) is not compatible with TP"]),
]


@pytest.mark.parametrize("line,ever_ready,kind,setting,words", CASES, ids=[c[2] + str(i) for i, c in enumerate(CASES)])
def test_known_failures(line: str, ever_ready: bool, kind: str, setting: str, words: list[str]) -> None:
    tail = ["INFO starting", *TRACEBACK, line]
    err = classify(tail, Context(model="Wan-AI/Wan2.2-T2V-A14B-Diffusers", gpus="0", port=8091,
                                 ever_ready=ever_ready, exit_code=1))
    assert isinstance(err, LauncherError)
    assert err.kind == kind
    assert err.setting == setting
    assert line in err.raw, "the raw log tail must be kept"
    text = str(err)
    assert "Why:" in text and "Fix:" in text
    for word in words:
        assert word in text


def test_version_mismatch_alone_and_as_a_note() -> None:
    warn = ("RuntimeWarning: vLLM and vLLM-Omni appear to have mismatched major/minor versions "
            "(vllm 0.26.0, vllm-omni 0.30.0)")
    alone = classify([warn, "Segmentation fault"], Context(exit_code=139))
    assert alone.kind == failures.VERSION_MISMATCH and alone.setting == "server_env"
    with_import = classify([warn, "ImportError: cannot import name 'X'"], Context(exit_code=1))
    assert with_import.kind == failures.IMPORT_ERROR
    assert "different major/minor versions" in str(with_import)


def test_benign_import_warnings_are_not_the_cause() -> None:
    tail = ['WARNING [interface.py:368] Failed to import from vllm._C: ModuleNotFoundError("No module named \'vllm._C\'")',
            "WARNING [ring_globals.py:73] FlashInfer is unavailable. Reason: No module named 'flashinfer'",
            "RuntimeError: something else"]
    assert classify(tail, Context(exit_code=1)).kind == failures.CRASH
    tagged = classify(["(APIServer pid=3) ModuleNotFoundError: No module named 'av'"], Context(exit_code=1))
    assert tagged.kind == failures.IMPORT_ERROR and "(APIServer" not in tagged.why


def test_unknown_and_killed() -> None:
    crash = classify(["something odd"], Context(exit_code=3, ever_ready=True))
    assert crash.kind == failures.CRASH and "after it was ready" in crash.what and "exit code 3" in crash.what
    killed = classify(["loading", "Killed"], Context(exit_code=137))
    assert killed.kind == failures.KILLED


def test_port_fix_depends_on_whether_the_port_was_configured() -> None:
    line = ["OSError: [Errno 98] Address already in use"]
    assert "leave it empty" in classify(line, Context(port=9000, port_configured=True)).fix
    assert "start again" in classify(line, Context(port=9000, port_configured=False)).fix
    assert "Port 9000" in failures.port_taken(9000).what


def test_job_error_explanations_are_the_ones_users_see() -> None:
    """A failed job's error is explained once, by the client (what Generate Video shows); the
    supervisor's status for the same OOM gives the same fix."""
    oom = job_failed_error("video_gen_1", "Video generation failed: CUDA out of memory. Tried to allocate 9.00 GiB.",
                           "raw")
    assert "ran out of memory" in oom.what and oom.fix == OOM_FIX
    status = classify(["torch.OutOfMemoryError: CUDA out of memory."], Context(ever_ready=True))
    assert status.kind == failures.OOM_JOB and OOM_FIX in status.fix
    no_image = job_failed_error("j", "No image is provided. This model requires an image to run.", "raw")
    assert no_image.setting == "image" and "start image" in no_image.what
    unknown = job_failed_error("j", "all fine", "raw")
    assert unknown.what.startswith("The server failed job j: all fine") and unknown.setting == ""


def test_timeout_and_hang_texts_keep_the_tail() -> None:
    tail = [f"line {i}" for i in range(100)]
    timeout = failures.startup_timeout(1800, "Loading weights: shards 3/8", tail, "startup_timeout_s")
    assert timeout.kind == failures.TIMEOUT and "30 minutes" in timeout.what and "shards 3/8" in timeout.why
    assert "line 99" in timeout.raw and "line 10" not in timeout.raw
    hung = failures.hung(125, tail)
    assert hung.kind == failures.HUNG and "125 s" in hung.what


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")))
def test_real_healthy_logs_are_not_misread_as_failures(name: str) -> None:
    lines = (LOGS / name).read_text(errors="replace").splitlines()
    err = classify(lines[-80:], Context(exit_code=0))
    assert err.kind == failures.CRASH
