"""Issue done-when: the argv printed by `argv --json`, run under the stub server (real vLLM-Omni
0.30 CLI + HTTP layer), reaches /health 200 and serves the model behind the API key.

The server it makes is the shared T2V_KEYED stub (shared_stubs.py starts it from exactly that
printed argv), so this check costs no server start of its own."""
from __future__ import annotations

import requests

from shared_stubs import KEY, T2V, T2V_KEYED, printed_t2v_launch
from stubserver import STUB_SCRIPT, server_python


def test_printed_argv_starts_a_server_that_becomes_healthy(stub_pool):
    with stub_pool.lease(T2V_KEYED) as (stub,):         # the lease waits for /health 200
        shown = printed_t2v_launch(stub.port)            # what `argv --json` prints for this server's port
        argv, env = shown["argv"], shown["env"]
        assert argv[0] == "vllm" and env["VLLM_API_KEY"] == "***"
        assert int(argv[argv.index("--port") + 1]) == stub.port
        assert stub.argv == [server_python(), STUB_SCRIPT, *argv[1:]]    # the printed argv, run as is
        assert {k: stub.env.get(k) for k in env} == {**env, "VLLM_API_KEY": KEY}   # its environment, a real key
        assert stub.health() == 200
        models = requests.get(f"http://127.0.0.1:{stub.port}/v1/models", timeout=5,
                              headers={"Authorization": f"Bearer {KEY}"}).json()
        assert models["data"][0]["id"] == T2V
        assert requests.get(f"http://127.0.0.1:{stub.port}/v1/models", timeout=5).status_code == 401
