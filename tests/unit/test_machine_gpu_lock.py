"""One GPU lock folder for the whole machine (issue 24): ComfyUI and `serve` with different data dirs both served
on GPU 0 while the lock lived in the data dir. Now a `serve` process holding GPU 0 refuses the Local Server's
start from another data dir, naming the holder; another user's holder is named by user; a CUDA_VISIBLE_DEVICES
of indices and UUIDs (issue 28's `0,GPU-...` crashed the lock with ValueError) maps to GPUs, or says why not.

The machine's default folder (/tmp/vllm-omni-launcher-gpu-locks) stands in as a folder of the test's, the same
for both processes, so that no test meets a real launcher of this machine."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from fake_nvml import FakeGpu, FakeNvml
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.planner.launch_plan import GPU_MEMORY_ENV
from vllm_omni_launcher.server.config import local_config
from vllm_omni_launcher.server.logs import failures
from vllm_omni_launcher.server.process import gpu_ids, gpu_lock, launch_prep, lock_holders
from vllm_omni_launcher.server.logs.failures import ServerFailure
from vllm_omni_launcher.server.config.local_config import LocalConfig
from vllm_omni_launcher.server.launch.spec import LaunchSpec
from vllm_omni_launcher.server.supervision.supervisor import Supervisor

TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
UUID_0 = "GPU-5f3c1e2a-0000-4000-8000-000000000000"
UUID_1 = "GPU-9a8b7c6d-1111-4111-8111-111111111111"
MIG_1 = "MIG-2c4e6a8b-2222-4222-8222-222222222222"


@pytest.fixture
def machine_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine's default lock folder, for this process and the launchers it starts."""
    folder = tmp_path / "machine-gpu-locks"
    monkeypatch.setattr(local_config, "default_gpu_lock_dir", lambda: str(folder))
    monkeypatch.setenv("VLLM_OMNI_LAUNCHER_GPU_LOCK_DIR", str(folder))
    return folder


@pytest.fixture
def serve_on_gpu0(tmp_path: Path, machine_locks: Path, server_env_python: str) -> Iterator[subprocess.Popen]:
    """`python -m vllm_omni_launcher serve --gpus 0` with its own data dir, holding GPU 0 while its server loads
    (a program that never becomes ready), until the test ends; then Ctrl-C stops it and its server."""
    fake = tmp_path / "never_ready_server.py"
    fake.write_text("import time\ntime.sleep(600)\n")
    config = tmp_path / "serve-config.json"
    config.write_text(f'{{"server_command": ["{server_env_python}", "{fake}"]}}')
    env = {**os.environ, "VLLM_OMNI_LAUNCHER_CONFIG": str(config), GPU_MEMORY_ENV: "80",
           "VLLM_OMNI_LAUNCHER_DATA_DIR": str(tmp_path / "serve-data")}
    proc = subprocess.Popen([sys.executable, "-m", "vllm_omni_launcher", "serve", "--model", TI2V, "--gpus", "0",
                             "--startup-timeout", "600"], env=env, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:                 # the lock is taken before the "starting" phase is shown
            seen.append(line)
            if "] starting:" in line:
                break
        assert any("] starting:" in line for line in seen), "".join(seen)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_holding_gpu0_refuses_a_local_server_from_another_data_dir(tmp_path: Path,
                                                                        serve_on_gpu0: subprocess.Popen) -> None:
    config = LocalConfig(server_command=(sys.executable, "-c", "raise SystemExit('must not run')"),
                         data_dir=str(tmp_path / "comfyui-data"))          # no gpu_lock_dir: the machine's
    sup = Supervisor(LaunchSpec(model=TI2V, gpus=(0,)), config)
    with pytest.raises(ServerFailure) as caught:
        sup.start(timeout=60)
    err = caught.value
    assert err.kind == failures.GPU_BUSY and err.what == "GPU 0 is already in use by another launcher process"
    assert f"process {serve_on_gpu0.pid} (" in err.why and "vllm_omni_launcher serve --model" in err.why
    assert f"runs {TI2V} on GPU 0" in err.why, "the holder's own record: model and GPUs"
    assert not (tmp_path / "comfyui-data" / "logs").exists(), "refused before anything was launched"
    # GPU 1 is free for the Local Server (the claim is per GPU, machine-wide)
    gpu_lock.acquire(None, (1,), gpu_lock.Holder.this_process("me")).release()


HOLDER = textwrap.dedent("""
    import sys, time
    from vllm_omni_launcher.server.process import gpu_lock
    lock = gpu_lock.acquire(sys.argv[1], (0,), gpu_lock.Holder.this_process("their model"))
    print("locked", flush=True)
    time.sleep(600)
""")


def test_another_users_holder_is_named_by_user_pid_and_command(machine_locks: Path, monkeypatch) -> None:
    """Who owns the holding process is the one thing faked here (a second user cannot be made without root);
    the holder is a real process with a real flock, found in the kernel's own lock list."""
    other = subprocess.Popen([sys.executable, "-c", HOLDER, str(machine_locks), "--their-serve"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "locked"
        assert lock_holders.flock_pids(machine_locks / "gpu-0.lock") == [other.pid]
        real_owner = lock_holders.owner
        monkeypatch.setattr(lock_holders, "owner",
                            lambda pid: (os.geteuid() + 4242, "bob") if pid == other.pid else real_owner(pid))
        with pytest.raises(ServerFailure) as caught:
            gpu_lock.acquire(None, (0,), gpu_lock.Holder.this_process("mine"))
        err = caught.value
        assert f"process {other.pid} of user bob (" in err.why and "--their-serve" in err.why
        assert "their model" not in err.why, "another user's record is never read"
        assert err.fix.startswith("ask bob to stop it") and "select other GPUs" in err.fix
    finally:
        other.kill()
        other.wait()


def test_the_kernels_lock_list_is_read_for_holders_not_waiters_or_posix_locks(tmp_path: Path) -> None:
    lock = tmp_path / "gpu-0.lock"
    lock.write_bytes(b"")
    st = lock.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    table = [f"1: FLOCK  ADVISORY  WRITE 101 {dev} 0 EOF",
             f"1: -> FLOCK  ADVISORY  WRITE 102 {dev} 0 EOF",         # waiting, holds nothing
             f"2: POSIX  ADVISORY  WRITE 103 {dev} 0 EOF",
             f"3: FLOCK  ADVISORY  READ  104 {dev} 0 EOF",
             f"4: FLOCK  ADVISORY  WRITE 105 00:00:{st.st_ino + 1} 0 EOF"]
    assert lock_holders.flock_pids(lock, table=table) == [101, 104]
    assert lock_holders.flock_pids(lock, writers_only=True, table=table) == [101]
    other_dev = [f"1: FLOCK  ADVISORY  WRITE 201 ab:cd:{st.st_ino} 0 EOF"]   # btrfs / overlayfs: another device
    assert lock_holders.flock_pids(lock, table=other_dev) == [201]


def test_the_default_lock_folder_is_the_machines_not_the_data_dirs(tmp_path: Path, machine_locks: Path) -> None:
    assert local_config.MACHINE_GPU_LOCK_DIR == "/tmp/vllm-omni-launcher-gpu-locks"
    assert LocalConfig(data_dir=str(tmp_path / "a")).gpu_lock_dir is None
    assert gpu_lock.lock_dir(None) == machine_locks
    assert stat.S_IMODE(machine_locks.stat().st_mode) == 0o1777, "shared like /tmp: sticky, every user may lock"
    open_to_all = tmp_path / "not-sticky"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    with pytest.raises(LauncherError) as caught:
        gpu_lock.lock_dir(str(open_to_all))
    assert "not sticky, so anyone could replace the lock files" in caught.value.why
    assert caught.value.setting == "gpu_lock_dir"


# ---- CUDA_VISIBLE_DEVICES: indices, UUIDs and MIG names, mixed -------------------------------------------
def fake_nvml(uuids: list[str], migs: dict[int, list[str]]) -> FakeNvml:
    """NVML of a machine whose GPUs have these UUIDs (and MIG instances, each GPU's last MIG slot empty)."""
    return FakeNvml([FakeGpu(uuid=uuid, migs=(*migs[i], None) if i in migs else None) for i, uuid in enumerate(uuids)])


MACHINE = {UUID_0: 0, UUID_1: 1, MIG_1: 1}


def test_mixed_indices_and_uuids_map_to_the_gpus_they_name() -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"0,{UUID_1}"}
    assert gpu_lock.targets(None, env, lambda: MACHINE) == (0, 1), "no ValueError: the UUID is GPU 1"
    assert gpu_lock.targets(None, {"CUDA_VISIBLE_DEVICES": UUID_0[:12]}, lambda: MACHINE) == (0,), "a prefix"
    assert gpu_lock.targets(None, {"CUDA_VISIBLE_DEVICES": f"{MIG_1},0"}, lambda: MACHINE) == (0, 1), \
        "a MIG instance locks its whole GPU"
    assert gpu_lock.targets(None, {"CUDA_VISIBLE_DEVICES": f"MIG-{UUID_1}/1/0"}, lambda: MACHINE) == (1,)
    assert gpu_lock.targets(None, env, lambda: None) is None, "without NVML: all visible GPUs, never a guess"
    assert gpu_lock.targets((1,), env, lambda: MACHINE) == (1,), "the spec's own list wins"


def test_a_name_no_gpu_here_has_is_refused_with_our_message() -> None:
    for value, why in (("0,GPU-00000000-dead", "no GPU of this machine has that UUID"),
                       ("1,GPU-", "that prefix matches several GPUs"), ("0,bogus", "no GPU of this machine")):
        with pytest.raises(LauncherError) as caught:
            gpu_lock.targets(None, {"CUDA_VISIBLE_DEVICES": value}, lambda: MACHINE)
        err = caught.value
        assert err.what.startswith(f"The server's CUDA_VISIBLE_DEVICES={value} names '") and why in err.why
        assert err.setting == "gpus" and "nvidia-smi -L" in err.why


def test_nvml_lists_each_gpus_uuid_and_its_mig_instances() -> None:
    nvml = fake_nvml([UUID_0, UUID_1], {1: [MIG_1]})
    assert gpu_ids.nvml_uuids(nvml) == MACHINE


def test_the_launch_claims_the_gpus_a_mixed_extra_env_names(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([UUID_0, UUID_1], {}))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = LocalConfig(extra_env={"CUDA_VISIBLE_DEVICES": f"{UUID_1},0"})
    assert launch_prep.gpu_targets(LaunchSpec(model=TI2V), config) == (0, 1)


def test_a_mixed_extra_env_is_held_to_the_gpus_it_names_through_the_lock(tmp_path: Path, monkeypatch) -> None:
    """The whole path a launch takes (a `0,GPU-...` value once crashed it with ValueError): the Supervisor reads
    the server's CUDA_VISIBLE_DEVICES, claims GPUs 0 and 1, and is refused while GPU 1 is held elsewhere."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([UUID_0, UUID_1], {}))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    config = LocalConfig(server_command=(sys.executable, "-c", "raise SystemExit('must not run')"),
                         data_dir=str(tmp_path / "data"), extra_env={"CUDA_VISIBLE_DEVICES": f"0,{UUID_1}"})
    other = gpu_lock.acquire(None, (1,), gpu_lock.Holder.this_process("another model"))
    try:
        with pytest.raises(ServerFailure) as caught:
            Supervisor(LaunchSpec(model=TI2V), config).start(timeout=60)
    finally:
        other.release()
    err = caught.value
    assert err.kind == failures.GPU_BUSY and err.what == "GPUs 0,1 are already in use by another launcher process", \
        err.what
    assert "runs another model on GPU 1" in err.why
    assert not (tmp_path / "data" / "logs").exists(), "refused before anything was launched"
    held = gpu_lock.acquire(None, launch_prep.gpu_targets(LaunchSpec(model=TI2V), config),
                            gpu_lock.Holder.this_process("mine"))
    try:
        assert held.gpus == (0, 1), "the UUID is GPU 1: both GPUs are claimed, not all of them"
        with pytest.raises(ServerFailure):
            gpu_lock.acquire(None, (0,), gpu_lock.Holder.this_process("third"))
    finally:
        held.release()
