"""A server that cannot reach Hugging Face is told as such (from a real vLLM-Omni 0.30 log of
`vllm serve Wan-AI/Wan2.2-TI2V-5B-Diffusers --omni` on a machine without a route to
huggingface.co), naming the model to download, the fixes and the log path; and every start
failure, classified or not, names the log path."""
from __future__ import annotations

from pathlib import Path

import pytest

from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.logs.failures import Context, classify, startup_timeout
from vllm_omni_launcher.server.logs.log_follower import read_tail

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
LOG = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "failures" / \
    "vllm-omni-0.30-serve-ti2v-5b-no-hf-access.log"
LOG_PATH = "/home/u/.local/share/vllm-omni-launcher/logs/Wan2.2-TI2V-5B-Diffusers-abc-g1.log"
CTX = Context(model=TI2V, gpus="0", exit_code=1, log_path=LOG_PATH)


def test_a_real_log_without_hugging_face_access_is_classified():
    tail = read_tail(str(LOG), lines=200)        # as the launcher reads a server's log
    err = classify(tail, CTX)
    assert err.kind == failures.HF_UNREACHABLE and err.setting == "model"
    assert err.kind in failures.PERMANENT           # a restart would only repeat it
    assert str(err).split("\n--- upstream said ---\n")[0] == (
        f"The server could not reach Hugging Face to download {TI2V}. Why: the server must download {TI2V} (it is "
        "not complete in this machine's Hugging Face cache), and its requests to huggingface.co failed ('[Errno -2] "
        f"Name or service not known' thrown while requesting HEAD https://huggingface.co/{TI2V}/resolve/main/"
        "config.json): the machine is offline, behind a proxy, or its DNS does not resolve huggingface.co. Fix: "
        f"download {TI2V} where Hugging Face is reachable (huggingface-cli download {TI2V}) and select the local "
        "folder as the model, or copy it into this machine's Hugging Face cache and set HF_HUB_OFFLINE=1 in the "
        "launcher config's extra_env; behind a mirror or a proxy, set HF_ENDPOINT (or HTTPS_PROXY) there; the whole "
        f"server log is {LOG_PATH}.")
    assert "httpx.ConnectError: [Errno -2] Name or service not known" in err.raw    # upstream's words kept


@pytest.mark.parametrize("line,host", [
    ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='hf-mirror.example', port=443): Max retries "
     "exceeded with url: /api/models/Wan-AI/Wan2.2-TI2V-5B-Diffusers (Caused by NameResolutionError(\"Failed to "
     "resolve 'hf-mirror.example'\")) https://hf-mirror.example/api/models/x", "hf-mirror.example"),
    ("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
     "cached files.", "huggingface.co"),
    ("(APIServer pid=3) ERROR 12-02 13:11:37 [repo_utils.py:117] Error retrieving file list: [Errno -2] Name or "
     "service not known", "the Hugging Face Hub"),
])
def test_other_wordings_of_an_unreachable_hub(line, host):
    err = classify(["Traceback (most recent call last):", line], CTX)
    assert err.kind == failures.HF_UNREACHABLE and f"its requests to {host} failed" in err.why


def test_offline_mode_without_the_files_says_so():
    err = classify(["huggingface_hub.errors.OfflineModeIsEnabled: Cannot reach https://huggingface.co/api/models/x: "
                    "offline mode is enabled. To disable it, please unset the `HF_HUB_OFFLINE` environment variable."],
                   CTX)
    assert err.kind == failures.HF_UNREACHABLE and "Hugging Face's offline mode is on" in err.why


@pytest.mark.parametrize("tail,exit_code", [
    (["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."], 1),          # classified
    (["vllm serve: error: unrecognized arguments: --model-type wan2_2"], 2),
    (["RuntimeError: something nobody has seen"], 1),                                          # unclassified
    (["RuntimeWarning: vLLM and vLLM-Omni appear to have mismatched major/minor versions", "boom"], 139),
    (["Killed"], 137),
])
def test_every_start_failure_names_its_log(tail, exit_code):
    err = classify(tail, Context(model=TI2V, exit_code=exit_code, log_path=LOG_PATH))
    assert err.fix.endswith(f"; the whole server log is {LOG_PATH}") and LOG_PATH in str(err).split("\n---")[0]


def test_a_start_that_times_out_names_its_log():
    err = startup_timeout(600, "Loading weights", ["INFO loading"], "'startup_timeout_s'", log_path=LOG_PATH)
    assert err.fix.endswith(f"; the whole server log is {LOG_PATH}")


def test_a_server_that_fell_back_to_its_cache_and_then_ran_out_of_memory_is_an_oom():
    tail = ["'[Errno -2] Name or service not known' thrown while requesting HEAD "
            f"https://huggingface.co/{TI2V}/resolve/main/model_index.json",
            "Retrying in 1s [Retry 1/5].",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    assert classify(tail, CTX).kind == failures.OOM_LOAD
