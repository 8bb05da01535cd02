"""`serve` as a systemd service: the unit `serve ... --print-systemd-unit` prints, and sd_notify.

The unit's choices, each for what the launcher does (docs/deploy/README.md explains them to operators):

* `Type=notify`: `serve` sends `READY=1` to `$NOTIFY_SOCKET` once the supervisor says the server is
  ready (`/health` 200 and `/v1/models` lists the model; for `--join`, every replica registered),
  `STATUS=` with each phase line, and `STOPPING=1` when it stops. So `systemctl start` returns when
  clients can use the server, and a unit ordered `After=` it starts after that. A health-check
  `ExecStartPost` could not be true: the port is a free one per launch unless configured, and a
  joined replica has none.
* `KillMode=mixed`: on stop systemd sends SIGTERM to the main process only (the launcher), which stops
  its server's process group in order (SIGINT for vLLM's graceful shutdown, then SIGTERM, then SIGKILL,
  then a check that no member is left) and exits; whatever is then still in the unit's cgroup gets
  SIGKILL at once. `control-group` would SIGTERM every vLLM worker at the same moment as the launcher,
  behind its back: the supervisor would see its server die while it is still deciding to stop, and
  upstream's engine processes would not get the API server's orderly shutdown.
  `TimeoutStopSec` covers the launcher's own stop (the supervisor's stop deadline, 30 s, after at most a
  cancelled start's) with room to spare; past it, systemd SIGKILLs the whole cgroup.
* `TimeoutStartSec=infinity`: `serve` has its own startup deadline (`--startup-timeout`, by default
  scaled by model size: a first start downloads tens of GB) and exits 1 when it passes.
* `Restart=on-failure`: the supervisor already restarts a crashed or hung server inside the service
  (at most 5 times in 30 minutes); systemd restarts the launcher itself when it exits with an error
  (exit 1, a budget used up, a killed launcher), never after a usage error (exit 2). Exit 130 (stopped
  before the server was ready) is a clean stop.
* The API key is a credential (`LoadCredential=`), read with `--api-key-from %d/api-key`: the same key
  for every restart, so ComfyUI users configure it once; the file on disk can stay root-only.
* Hardening that vLLM does not notice: `UMask=0077` (the launcher makes its own files 0600 anyway),
  /usr /boot /etc read-only, no privilege gain. Not `ProtectHome`: the HF cache and the server env
  usually live there. Not `PrivateTmp`: the machine's GPU lock folder is in /tmp (`gpu_lock_dir`), and a
  private /tmp would hide this service's GPUs from a ComfyUI on the same box.
* stdout and stderr go to journald (`journalctl -u vllm-omni-launcher`); the server's own log stays
  in the data dir's `logs/` (the path is in every error).
"""
from __future__ import annotations

import math
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ..server.registry import REPLACE_STOP_S, STOP_S

UNIT_NAME = "vllm-omni-launcher.service"
CREDENTIAL = "api-key"
CREDENTIAL_ARG = f"%d/{CREDENTIAL}"        # %d: systemd's credentials directory of the unit
DEFAULT_KEY_PATH = "/etc/vllm-omni-launcher/api-key"
# systemd's wait for the launcher's own stop, whose worst case is a cancelled start's replace and then the
# requested stop (the supervisor's deadlines): twice that, rounded up to a half minute (90 s today)
STOP_TIMEOUT_S = 30 * math.ceil(2 * (REPLACE_STOP_S + STOP_S) / 30)


# ---- sd_notify --------------------------------------------------------------------------------
def notify(*fields: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Send `fields` (e.g. "READY=1", "STATUS=...") to the service manager, one datagram to
    `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). False, and nothing sent, when
    not run by systemd, when the socket is gone, or when its queue is full (the send never waits:
    a reader that does not read must not stop the supervision): serving never depends on it."""
    where = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
    if not where or where[0] not in "/@":
        return False
    address = "\0" + where[1:] if where[0] == "@" else where
    message = "\n".join(_field(f) for f in fields).encode("utf-8", "replace")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.send(message, socket.MSG_DONTWAIT)
    except OSError:
        return False
    return True


def _field(text: str) -> str:
    """One `NAME=value` line: a newline in a status text would start another field."""
    return " ".join(text.splitlines())


# ---- the unit ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class UnitInputs:
    """What the unit names for one machine (`serve --print-systemd-unit` fills it from this one)."""

    exec_argv: Sequence[str]                  # ExecStart, the launcher's python first
    user: str
    group: str
    working_directory: str                    # where `python -m vllm_omni_launcher` finds the package
    environment: Mapping[str, str] = field(default_factory=dict)
    key_path: Optional[str] = None            # LoadCredential's source; None: no key (--no-api-key, --join)
    description: str = "vLLM-Omni Launcher: a supervised Wan2.2 server"


def render_unit(u: UnitInputs) -> str:
    """The unit file text (docs/deploy/vllm-omni-launcher.service is this with example values)."""
    install = [
        f"# {UNIT_NAME}: written by `python -m vllm_omni_launcher serve ... --print-systemd-unit`",
        "# Install: python -m vllm_omni_launcher serve ... --print-systemd-unit \\",
        f"#              | sudo tee /etc/systemd/system/{UNIT_NAME}",
    ]
    if u.key_path:
        install.append(f"# The key: sudo sh -c 'umask 077; mkdir -p {os.path.dirname(u.key_path)}; python3 -c "
                       f"\"import secrets; print(secrets.token_urlsafe(32))\" > {u.key_path}'")
    install += [
        "# Start:   sudo systemctl daemon-reload && sudo systemctl enable --now vllm-omni-launcher",
        "# Logs:    journalctl -u vllm-omni-launcher -f   (the server's own log: the data dir's logs/)",
        "# Why each setting: docs/deploy/README.md (\"Run a shared GPU box\").",
    ]
    lines = [*install, "",
             "[Unit]",
             f"Description={u.description}",
             "After=network-online.target",
             "Wants=network-online.target",
             "StartLimitIntervalSec=30min",
             "StartLimitBurst=5",
             "",
             "[Service]",
             "Type=notify",
             "NotifyAccess=main",
             f"User={u.user}",
             f"Group={u.group}",
             f"WorkingDirectory={_specifiers(u.working_directory)}"]
    lines += [f"Environment={_env_word(name, value)}" for name, value in u.environment.items()]
    if u.key_path:
        lines.append(f"LoadCredential={CREDENTIAL}:{u.key_path}")
    lines += [f"ExecStart={' '.join(_quote(a) for a in u.exec_argv)}",
              "Restart=on-failure",
              "RestartSec=10s",
              "RestartPreventExitStatus=2",
              "SuccessExitStatus=130",
              "TimeoutStartSec=infinity",
              f"TimeoutStopSec={STOP_TIMEOUT_S}s",
              "KillMode=mixed",
              "KillSignal=SIGTERM",
              "StandardOutput=journal",
              "StandardError=journal",
              "SyslogIdentifier=vllm-omni-launcher",
              "UMask=0077",
              "ProtectSystem=full",
              "NoNewPrivileges=yes",
              "",
              "[Install]",
              "WantedBy=multi-user.target",
              ""]
    return "\n".join(lines)


_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def _specifiers(text: str) -> str:
    """`text` with systemd's `%` specifiers made literal (every setting expands them)."""
    if "\n" in text:
        raise ValueError(f"{text!r}: a unit file value cannot hold a newline")
    return text.replace("%", "%%")


def _env_word(name: str, value: str) -> str:
    """One `Environment=` assignment (specifiers are expanded there, `$` is not)."""
    text = _specifiers(f"{name}={value}")
    return text if _PLAIN.fullmatch(text) else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _quote(arg: str) -> str:
    """`arg` as one word of a unit file: systemd expands `$NAME` and `%x` itself, so literal ones are
    doubled, and a word with spaces or quotes is double-quoted (our own `%d/...` is kept as is)."""
    if arg == CREDENTIAL_ARG:
        return arg
    text = _specifiers(arg).replace("$", "$$")
    if _PLAIN.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
