"""The NVML stand-in the unit tests use (tests/helpers/fake_nvml.py) offers only what the installed
pynvml (nvidia-ml-py, a dependency of the pack) offers: every function by the same name with the same
parameters, every constant with the same value, the same exception type and result types; and
every NVML name the launcher's code calls is one the fake answers. A fake that drifted from the
real interface would let the planner and doctor tests pass against calls a real GPU box refuses."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pynvml
import pytest

import fake_nvml
from fake_nvml import FakeGpu, FakeNvml

PACKAGE = Path(__file__).resolve().parents[2]
# Where the launcher talks to NVML (planner/gpus.py says: every function takes an `nvml` module).
NVML_USERS = ("planner/gpus.py", "planner/doctor.py", "planner/ladder.py", "server/process/gpu_ids.py")
# The machine the fake describes: test-side settings and counters, not part of NVML's interface.
FAKE_ONLY = {"gpus", "init_error", "driver", "p2p_read_ok", "nvlink", "topology", "inits", "shutdowns"}


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def _params(fn: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


def test_every_name_the_fake_offers_is_pynvmls_or_the_fakes_own_setting() -> None:
    fake = FakeNvml()
    unknown = {name for name in _public(fake) - FAKE_ONLY if not hasattr(pynvml, name)}
    assert not unknown, f"the fake offers {sorted(unknown)}, which pynvml does not have"


def test_each_function_takes_the_parameters_pynvmls_takes() -> None:
    fake = FakeNvml()
    functions = sorted(name for name in _public(fake) if name.startswith("nvml"))
    assert len(functions) >= 10, functions
    for name in functions:
        assert callable(getattr(pynvml, name)), name
        assert _params(getattr(fake, name)) == _params(getattr(pynvml, name)), name


def test_each_constant_has_pynvmls_value() -> None:
    constants = {name for name in _public(fake_nvml) | _public(FakeNvml()) if name.startswith("NVML_")}
    assert "NVML_P2P_CAPS_INDEX_READ" in constants and "NVML_ERROR_LIBRARY_NOT_FOUND" in constants
    for name in sorted(constants):
        ours = getattr(fake_nvml, name, None)
        ours = getattr(FakeNvml, name) if ours is None else ours
        assert ours == getattr(pynvml, name), name


@pytest.mark.parametrize("code", [fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND, fake_nvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  fake_nvml.NVML_ERROR_NO_PERMISSION, fake_nvml.NVML_ERROR_UNKNOWN])
def test_a_failed_start_raises_pynvmls_error_with_its_code_and_text(code: int) -> None:
    assert FakeNvml.NVMLError is pynvml.NVMLError
    with pytest.raises(pynvml.NVMLError) as caught:
        FakeNvml(init_error=code).nvmlInit()
    assert caught.value.value == code and type(caught.value) is type(pynvml.NVMLError(code))
    assert str(caught.value) == str(pynvml.NVMLError(code))


def test_results_have_pynvmls_types_and_calls_need_nvml_started() -> None:
    fake = FakeNvml([FakeGpu(free_gib=60.0, processes=((4242, 1.5),)), FakeGpu()])
    with pytest.raises(pynvml.NVMLError) as caught:
        fake.nvmlDeviceGetCount()
    assert caught.value.value == pynvml.NVML_ERROR_UNINITIALIZED
    fake.nvmlInit()
    a, b = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    memory = fake.nvmlDeviceGetMemoryInfo(a)
    assert type(memory) is pynvml.c_nvmlMemory_t and memory.total == memory.free + memory.used
    proc, = fake.nvmlDeviceGetComputeRunningProcesses_v3(a)
    fields = {name for name, _type in pynvml.c_nvmlProcessInfo_v3_t._fields_}
    assert type(proc) is pynvml.nvmlFriendlyObject and set(vars(proc)) == fields and proc.pid == 4242
    assert isinstance(fake.nvmlDeviceGetName(a), str) and isinstance(fake.nvmlSystemGetDriverVersion(), str)
    major, minor = fake.nvmlDeviceGetCudaComputeCapability(a)
    assert isinstance(major, int) and isinstance(minor, int)
    statuses = {getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVML_P2P_STATUS_")}
    assert fake.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) in statuses
    with pytest.raises(TypeError):      # ctypes refuses nvidia-ml-py 13's tuple, as the real call does
        fake.nvmlDeviceGetP2PStatus(a, b, pynvml.NVML_P2P_CAPS_INDEX_READ)
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError):
        fake.nvmlDeviceGetName(a)


def test_every_nvml_name_the_launcher_uses_is_in_pynvml_and_the_fake() -> None:
    used: set[str] = set()
    for path in NVML_USERS:
        used |= set(re.findall(r"\b(nvml[A-Z]\w+|NVML_[A-Z0-9_]+)\b", (PACKAGE / path).read_text()))
    assert "nvmlDeviceGetMemoryInfo" in used and "NVML_P2P_STATUS_OK" in used, sorted(used)
    assert not {name for name in used if not hasattr(pynvml, name)}, "the launcher calls names pynvml lacks"
    # processes_on_gpus falls back to the unversioned call only where _v3 is missing; the fake has _v3
    missing = used - _public(FakeNvml()) - _public(fake_nvml) - {"nvmlDeviceGetComputeRunningProcesses"}
    assert not missing, f"the launcher uses {sorted(missing)}, which the fake does not answer"
