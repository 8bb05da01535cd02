"""Server environment versions: found from the server command, and a bad pair refused before launch."""
from __future__ import annotations

import sys

import pytest

from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.server.launch import versions
from vllm_omni_launcher.server.launch.versions import ServerVersions


def test_interpreter_is_found_from_the_command(tmp_path):
    assert versions.server_python(["/env/bin/python3", "stub.py"]) == "/env/bin/python3"
    script = tmp_path / "vllm"
    script.write_text("#!/opt/env/bin/python3.12\nprint()\n")
    assert versions.server_python([str(script)]) == "/opt/env/bin/python3.12"
    assert versions.server_python([], explicit="/x/python") == "/x/python"


def test_probe_reads_installed_versions_of_a_real_interpreter():
    found = versions.detect([sys.executable, "-c", "pass"])
    assert found is not None and found.python == sys.version.split()[0]


@pytest.mark.parametrize("found, message, setting", [
    (ServerVersions("3.12", None, "0.30.0"), "has no vllm", "server_env"),
    (ServerVersions("3.12", "0.30.0", None), "has no vllm-omni", "server_env"),
    (ServerVersions("3.12", "0.26.0", "0.30.0"), "do not match", "server_env"),
    (ServerVersions("3.12", "0.12.0", "0.12.0"), "not a version this launcher knows", "server_env"),
])
def test_bad_server_environments_are_refused_with_the_fix(found, message, setting):
    with pytest.raises(LauncherError) as err:
        found.check()
    assert message in str(err.value) and err.value.setting == setting and "python -m vllm_omni_launcher setup" in err.value.fix


def test_supported_pairs_pass_and_give_the_flag_version():
    for pair in ("0.26.0", "0.30.0"):
        ServerVersions("3.12", pair, pair).check()
    assert ServerVersions("3.12", "0.26.0", "0.26.0").omni_minor == (0, 26)
