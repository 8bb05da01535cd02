"""A workflow string a node refuses is echoed in the error quoted and cut (config_values.shown:
escapes visible as \\u001b, at most 40 characters of it), never raw: a 200,000-character value with
terminal escapes and a bidi override gives a short message that cannot rewrite a terminal or the UI.
Covers every place a node input is named back: Load Model, Load Wan Pipeline Model, LoRA, the
gpus widget (ids and count=N), Remote Server's remote_server and url, interpolation_model."""
from __future__ import annotations

import pytest

from vllm_omni_launcher.client.origins import origin
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import FAMILIES
from vllm_omni_launcher.nodes import NODES, session
from vllm_omni_launcher.nodes.handles import ModelChoice
from vllm_omni_launcher.planner.gpus import select_gpus
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.config.remote_servers import USE_URL, remote_target

HOSTILE = "\x1b[2J\x1b]0;owned\x07\u202eevil" + "A" * 200_000
TI2V = FAMILIES["ti2v_5b"].hf_id


def _refusals():
    """(what, callable) for each echo site, given HOSTILE."""
    lora = NODES["VLLMOmniLora"]
    model = ModelChoice(TI2V, "ti2v_5b", TI2V)
    return [
        ("Load Model validate", lambda: NODES["VLLMOmniLoadModel"].validate({"model": HOSTILE})),
        ("Load Model run", lambda: NODES["VLLMOmniLoadModel"].call({"model": HOSTILE})),
        ("Pipeline Model validate", lambda: NODES["VLLMOmniLoadPipelineModel"].validate({"model": HOSTILE})),
        ("Pipeline Model run", lambda: NODES["VLLMOmniLoadPipelineModel"].call({"model": HOSTILE})),
        ("LoRA validate", lambda: lora.validate({"lora_name": HOSTILE})),
        ("LoRA run", lambda: lora.call({"model": model, "lora_name": HOSTILE, "strength": 1.0, "expert": "both"})),
        ("gpus ids", lambda: select_gpus("0," + HOSTILE, [0, 1])),
        ("gpus count", lambda: select_gpus("count=" + HOSTILE, [0, 1])),
        ("gpus count range", lambda: select_gpus("count=" + "9" * 4000, [0, 1])),
        ("remote_server", lambda: remote_target(LocalConfig(), "http://127.0.0.1:8091", HOSTILE)),
        ("url", lambda: remote_target(LocalConfig(), HOSTILE, USE_URL)),
        ("url with a long host", lambda: origin("http://" + "a" * 200_000 + ":8091")),
        ("interpolation_model", lambda: session.interpolation_for("x2", HOSTILE)),
        ("a number of 4000 digits", lambda: lora.call({"model": model, "lora_name": "x", "strength": 9 ** 4000,
                                                        "expert": "both"})),
    ]


@pytest.mark.parametrize("what, refuse", _refusals(), ids=[w for w, _ in _refusals()])
def test_a_hostile_string_comes_back_short_and_without_escapes(what, refuse):
    try:
        result = refuse()
    except LauncherError as err:
        result = str(err)
    assert isinstance(result, str), f"{what} accepted the hostile value"
    assert len(result) < 1500
    assert not any(ch in result for ch in "\x1b\x07\u202e")
    assert "A" * 41 not in result and "a" * 300 not in result and "9" * 100 not in result
    assert not any(ch.isdigit() and result.count(ch) > 100 for ch in "0123456789")


def test_the_value_is_still_named_so_the_user_can_find_it():
    with pytest.raises(LauncherError) as err:
        NODES["VLLMOmniLoadModel"].call({"model": "local/not-here"})
    assert err.value.what.startswith('Load Model got the string "local/not-here", which is not one of')
    with pytest.raises(LauncherError) as err:
        select_gpus("0,x", [0, 1])
    assert err.value.what == 'gpus got the string "0,x", which is not a GPU list' and err.value.setting == "gpus"
    with pytest.raises(LauncherError) as err:
        origin("http://gpu box:8091")
    assert err.value.what == "'http://gpu box:8091' is not a usable server URL"


def test_valid_values_still_pass():
    assert select_gpus("0,1", [0, 1]) == (0, 1) and select_gpus("count=1", [0, 1]) == (0,)
    assert origin("http://" + "a" * 63 + ".example:8091") == "http://" + "a" * 63 + ".example:8091"
    assert remote_target(LocalConfig(), "http://127.0.0.1:8091/v1", USE_URL) == ("", "http://127.0.0.1:8091", None)
