"""A setting's environment variable is spelled by one rule (errors/config_names.env_var: the prefix, then
the declared `env=` name or the key upper-cased): the config reads each variable by it, and every
message, in any layer, names the variable the config really reads. No code spells a setting's
variable out by hand."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vllm_omni_launcher.client import clip_memory
from vllm_omni_launcher.client.exchange_errors import deadline_error
from vllm_omni_launcher.client.transport import env_proxy_note
from vllm_omni_launcher.errors import config_names
from vllm_omni_launcher.server.config import local_config
from vllm_omni_launcher.server.config.settings import settings_of
from vllm_omni_launcher.server.launch.flags import LOCAL_ONLY_FLAGS
from vllm_omni_launcher.server.logs.failures import port_taken
from vllm_omni_launcher.server.process.port_owner import listener_not_ours

PACK = Path(config_names.__file__).resolve().parents[1]
WITH_VARIABLE = [s for s in settings_of(local_config.LocalConfig) if s.extra.get("env", "") is not None]


@pytest.mark.parametrize("s", WITH_VARIABLE, ids=lambda s: s.name)
def test_each_variable_is_the_rule_applied_to_its_declaration_and_is_read(s, tmp_path):
    var = local_config.setting_env_var(s.name)
    assert var == config_names.env_var(s.name, s.extra.get("env", ""))
    value = {"server_command": "/opt/env/bin/vllm", "port": "8123", "trust_remote_code": "1",
             "max_batch_clips": "3", "remote_proxy": "http://proxy:3128"}.get(s.name)
    if value is not None:
        environ = {config_names.CONFIG_VAR: str(tmp_path / "none.json"), var: value}
        assert getattr(local_config.load_local_config(environ), s.name) != s.default


def test_file_only_settings_have_no_variable():
    for name in ("remote_servers", "extra_env"):
        with pytest.raises(KeyError):
            local_config.setting_env_var(name)


def test_messages_in_every_layer_name_the_variable_the_config_reads():
    assert clip_memory.ENV_VAR == local_config.setting_env_var(clip_memory.SETTING)
    fix = deadline_error("http://h:1", "Downloading", "body", 5.0).fix
    assert f"({config_names.CONFIG_FILE_NAME} or {local_config.setting_env_var('body_timeout_s')})" in fix
    assert f"({local_config.setting_env_var('remote_proxy')})" in env_proxy_note({"HTTPS_PROXY": "http://p:1"})
    port = local_config.setting_env_var("port")
    assert port in listener_not_ours("127.0.0.1", 8091, "nginx (pid 7)").fix and port in port_taken(8091).fix
    assert local_config.setting_env_var("host") in LOCAL_ONLY_FLAGS["--host"]


def _code_strings(tree: ast.AST) -> list[str]:
    """The string constants of a module that are not docstrings (f-string parts included)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_no_code_spells_a_settings_variable_by_hand():
    names = {local_config.setting_env_var(s.name) for s in WITH_VARIABLE} | {config_names.CONFIG_VAR}
    found = []
    for path in sorted(PACK.rglob("*.py")):
        relative = path.relative_to(PACK)
        if relative.parts[0] in ("tests", "bench") or relative.parts[0].startswith("."):
            continue
        for text in _code_strings(ast.parse(path.read_text(encoding="utf-8"))):
            found += [f"{relative}: {name}" for name in names if name in text]
    assert not found, "spell these with config_names.env_var / local_config.setting_env_var:\n" + "\n".join(found)
