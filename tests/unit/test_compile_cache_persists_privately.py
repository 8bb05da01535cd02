"""A launched server's torch.compile cache outlives a reboot and is ours alone: a 0700 folder under the data dir
unless the user names a cache, and refused (not tightened) when it is a link, another user's or writable by others,
since the server runs the compiled code it finds there."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.config.environment import (INDUCTOR_CACHE, TRITON_CACHE, server_environment,
                                                          torch_default_cache_dir)
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.process import launch_prep

SPEC = LaunchSpec(model="Wan-AI/Wan2.2-TI2V-5B-Diffusers", gpus=(0,))


@pytest.fixture
def no_user_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ComfyUI's environment names no compile cache, and the umask would make a folder world-writable."""
    monkeypatch.delenv(INDUCTOR_CACHE, raising=False)
    monkeypatch.delenv(TRITON_CACHE, raising=False)
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def launched_env(data: Path, config: LocalConfig | None = None) -> dict[str, str]:
    """The environment `prepare` gives a server launched with data dir `data`."""
    config = config or LocalConfig(data_dir=str(data))
    return launch_prep.prepare(SPEC, config, ["vllm"], str(data), True, None, lambda: False).env


def refusal(data: Path) -> LauncherError:
    with pytest.raises(LauncherError) as caught:
        launched_env(data)
    return caught.value


def test_a_launched_server_gets_a_0700_compile_cache_under_the_data_dir_and_keeps_it(tmp_path: Path,
                                                                                       no_user_cache: None) -> None:
    data = tmp_path / "data"
    cache = data / "torch_compile_cache"
    env = launched_env(data)
    assert env[INDUCTOR_CACHE] == str(cache)
    assert cache.is_dir() and not cache.is_symlink() and stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert TRITON_CACHE not in env               # inductor's Triton kernels go under the inductor cache
    (cache / "fxgraph").mkdir()                  # what the first server compiled
    assert launched_env(data)[INDUCTOR_CACHE] == str(cache) and (cache / "fxgraph").is_dir()


@pytest.mark.parametrize("where", ["environment", "extra_env"])
def test_a_cache_the_user_names_is_kept_and_none_of_ours_is_made(tmp_path: Path, no_user_cache: None,
                                                                 monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    data, mine = tmp_path / "data", str(tmp_path / "my-cache")
    config = LocalConfig(data_dir=str(data), extra_env={INDUCTOR_CACHE: mine} if where == "extra_env" else {})
    if where == "environment":
        monkeypatch.setenv(INDUCTOR_CACHE, mine)
    assert launched_env(data, config)[INDUCTOR_CACHE] == mine
    assert not (data / "torch_compile_cache").exists()


def test_torchs_own_default_in_comfyuis_process_gives_way_to_the_data_dir_cache(tmp_path: Path) -> None:
    """ComfyUI's nodes import torch._inductor, and torch then writes its /tmp default into ComfyUI's own
    environment: that is torch's value, not the user's, so the server still gets ours (real torch)."""
    code = ("import json, os, sys\nfrom pathlib import Path\nimport torch._inductor.config\n"
            "from vllm_omni_launcher.server.config.environment import INDUCTOR_CACHE, server_environment\n"
            "from vllm_omni_launcher.server.config.local_config import LocalConfig\n"
            "env = server_environment(os.environ, LocalConfig(), {}, compile_cache=lambda: Path(sys.argv[1]))\n"
            "print(json.dumps([os.environ.get(INDUCTOR_CACHE), env.get(INDUCTOR_CACHE)]))\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    parent = {k: v for k, v in os.environ.items() if k not in (INDUCTOR_CACHE, TRITON_CACHE)} | {"TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ours")], env=parent, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    written, given = json.loads(done.stdout.splitlines()[-1])
    assert written and Path(written).parent == tmp          # torch wrote <tempdir>/torchinductor_<user>
    assert given == str(tmp_path / "ours")


def test_torchs_triton_default_does_not_reach_the_server_but_a_users_does(tmp_path: Path) -> None:
    torchs = os.path.join(torch_default_cache_dir(), "triton", "0")
    assert TRITON_CACHE not in server_environment({TRITON_CACHE: torchs}, LocalConfig(), {})
    assert server_environment({TRITON_CACHE: "/srv/triton"}, LocalConfig(), {})[TRITON_CACHE] == "/srv/triton"


def test_a_linked_compile_cache_is_refused_before_anything_is_wiped(tmp_path: Path, no_user_cache: None) -> None:
    data, victim = tmp_path / "data", tmp_path / "other-program"
    victim.mkdir()
    (victim / "kernel.py").write_text("print('planted')\n")
    old_job = data / "storage" / SPEC.fingerprint() / "job.mp4"
    old_job.parent.mkdir(parents=True)
    old_job.write_bytes(b"the last server's video")
    (data / "torch_compile_cache").symlink_to(victim)
    err = refusal(data)
    assert err.what == f"The launcher refuses to use {data / 'torch_compile_cache'} in its data dir"
    assert "runs the compiled code" in err.why and "symbolic link" in err.why
    assert f"rm -rf {data / 'torch_compile_cache'}" in err.fix and "extra_env" in err.fix and "data_dir" in err.fix
    assert (victim / "kernel.py").read_text() == "print('planted')\n" and old_job.exists()


@pytest.mark.parametrize("mode, who", [(0o770, "group"), (0o707, "others"), (0o777, "group and others")],
                         ids=["group", "others", "both"])
def test_a_compile_cache_others_can_write_is_refused_not_tightened(tmp_path: Path, no_user_cache: None, mode: int,
                                                                   who: str) -> None:
    data = tmp_path / "data"
    cache = data / "torch_compile_cache"
    cache.mkdir(parents=True)
    os.chmod(cache, mode)
    err = refusal(data)
    assert err.what == f"The launcher refuses to use {cache} in its data dir"
    assert f"writable by {who} (mode {mode:04o})" in err.why and "does not tighten such a folder" in err.why
    assert stat.S_IMODE(cache.stat().st_mode) == mode


def test_a_compile_cache_of_another_user_is_refused_even_for_root(tmp_path: Path, no_user_cache: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's folder, without needing root to make one: the cache folder's lstat reports uid 4242 (the
    hostile peer), everything else is the real file system."""
    data = tmp_path / "data"
    cache = data / "torch_compile_cache"
    cache.mkdir(parents=True, mode=0o700)
    real_lstat = os.lstat

    def lstat(path, *args, **kwargs):
        st = real_lstat(path, *args, **kwargs)
        if Path(path) == cache:
            fields = list(st[:10])
            fields[4] = 4242                      # st_uid
            return os.stat_result(fields)
        return st

    monkeypatch.setattr(os, "lstat", lstat)
    err = refusal(data)
    assert err.what == f"The launcher refuses to use {cache} in its data dir"
    assert f"belongs to uid 4242, not to you (uid {os.geteuid()})" in err.why