"""ComfyUI's caching keys for our nodes: an unchanged graph stays cached (no NaN fingerprint
upstream of Generate Video), a named remote server's identity follows its configured URL, report
nodes act on every queue, and handles of the same server are equal (ComfyUI compares them).
"""
from __future__ import annotations

import json
import math

from vllm_omni_launcher.nodes import NODES
from vllm_omni_launcher.nodes.handles import ServerHandle
from vllm_omni_launcher.server.config.remote_servers import USE_URL


def test_caching_keys_keep_an_unchanged_graph_cached():
    # ComfyUI folds each upstream fingerprint_inputs into the downstream cache key: NaN (!= itself)
    # upstream of Generate Video would re-run the job on every queue.
    assert [n for n in NODES.values() if n.fingerprint is not None and not n.output_node] == [NODES[
        "VLLMOmniRemoteServer"]]                                        # Local Server and the rest: inputs only
    remote = NODES["VLLMOmniRemoteServer"].fingerprint
    first = remote(url="http://127.0.0.1:8091", model_family="ti2v_5b", remote_server=USE_URL)
    assert first == "http://127.0.0.1:8091"                             # stable, and not NaN
    assert remote(url="http://127.0.0.1:8091", model_family="ti2v_5b", remote_server=USE_URL) == first
    assert remote(url="http://127.0.0.1:9999", model_family="ti2v_5b") != first
    for node_id in ("VLLMOmniStopServer", "VLLMOmniServerStatus", "VLLMOmniDoctor"):
        node = NODES[node_id]
        assert node.output_node and math.isnan(node.fingerprint())     # report nodes act on every queue
        assert [o.kind for o in node.outputs] == ["STRING"]             # nothing expensive downstream


def test_remote_identity_follows_the_configured_url_of_a_named_server(tmp_path, monkeypatch):
    config = tmp_path / "launcher.json"
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_CONFIG", str(config))
    config.write_text(json.dumps({"remote_servers": {"box": {"url": "http://127.0.0.1:8091"}}}))
    remote = NODES["VLLMOmniRemoteServer"].fingerprint
    before = remote(url="ignored", model_family="ti2v_5b", remote_server="box")
    assert before == remote(url="also ignored", model_family="ti2v_5b", remote_server="box")
    config.write_text(json.dumps({"remote_servers": {"box": {"url": "http://127.0.0.1:8092"}}}))
    assert remote(url="ignored", model_family="ti2v_5b", remote_server="box") != before
    config.write_text("{not json")
    assert remote(url="x", model_family="ti2v_5b", remote_server="box") == "box="   # never raises


def test_handles_carry_no_process_and_are_equal_for_the_same_server():
    a = ServerHandle("remote", "http://127.0.0.1:1", "wan", "ti2v_5b")
    b = ServerHandle("remote", "http://127.0.0.1:1", "wan", "ti2v_5b")       # another object, same server
    assert a is not b and a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != ServerHandle("remote", "http://127.0.0.1:2", "wan", "ti2v_5b"), "another server"
    assert "generation" not in repr(a)
