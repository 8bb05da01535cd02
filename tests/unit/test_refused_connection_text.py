"""A refused connection says what the user can do about it: a remote server is started on its own
machine with `serve` (no node of this ComfyUI starts it), a server this launcher started is waited for
or restarted by the launcher. The `serve` command the remote text gives is parsed by the real CLI."""
from __future__ import annotations

import shlex
import socket

import pytest

from canned_server import FakeSleep
from vllm_omni_launcher.cli import build_parser
from vllm_omni_launcher.client.api import LOCAL_LOG_HINT, REMOTE_LOG_HINT, VideoClient
from vllm_omni_launcher.client.exchange_errors import start_remote_hint
from vllm_omni_launcher.errors import LauncherError


def closed_port() -> int:
    """A port nothing listens on (bound, then released: a connection to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused_error(**client_args: object) -> LauncherError:
    port = closed_port()
    client = VideoClient(f"http://127.0.0.1:{port}", sleep=FakeSleep(), **client_args)  # type: ignore[arg-type]
    with pytest.raises(LauncherError) as info:
        client.models()
    assert info.value.kind == "refused" and f":{port}" in info.value.what
    return info.value


def test_a_remote_server_is_started_on_its_own_machine_with_serve() -> None:
    err = refused_error()                                  # VideoClient's default: a server it did not start
    port = err.what.split(":")[-1].split()[0]
    assert "start it on the GPU machine" in err.fix and "Remote Server's url" in err.fix
    assert "remote_server" in err.fix and "launcher node" not in err.fix and "Server Status" not in err.fix
    assert f"--port {port}`" in err.fix


def test_the_serve_command_given_is_one_the_cli_accepts() -> None:
    hint = start_remote_hint("http://gpu-box.lan:8200")
    command = shlex.split(hint.split("`")[1])
    assert command[:3] == ["python", "-m", "vllm_omni_launcher"] and command[3] == "serve"
    args = build_parser("serve").parse_args(command[4:])
    assert (args.model, args.host, args.port) == ("MODEL", "0.0.0.0", 8200)


@pytest.mark.parametrize("url,port", [("http://gpu-box", 80), ("https://gpu-box/", 443), ("http://[::1]:9001", 9001)])
def test_the_port_is_the_one_the_url_names(url: str, port: int) -> None:
    assert f"--port {port}`" in start_remote_hint(url)


def test_a_server_this_launcher_started_is_waited_for_not_started_by_hand() -> None:
    err = refused_error(supervised=True)
    assert "the launcher started this server" in err.fix and "restarts a crashed server" in err.fix
    assert "serve --model" not in err.fix and "Remote Server" not in err.fix and err.setting == "server"


def test_the_mid_job_hint_follows_who_started_the_server() -> None:
    assert VideoClient("http://127.0.0.1:1").log_hint == REMOTE_LOG_HINT
    assert VideoClient("http://127.0.0.1:1", supervised=True).log_hint == LOCAL_LOG_HINT
    assert VideoClient("http://127.0.0.1:1", supervised=True, log_hint="the log is x").log_hint == "the log is x"
