"""The local machine's configuration: what no workflow may decide.

A workflow JSON is shared by strangers, so the program to execute, the host to bind, remote
code trust and where API keys go come only from here: a JSON file (`vllm_omni_launcher.json`
in ComfyUI's user directory when ComfyUI loaded the pack, in ~/.config/vllm-omni-launcher for the
command line, or the path in VLLM_OMNI_LAUNCHER_CONFIG), overridden by environment variables.
Nodes and the CLI read it; they never write it.

Each setting is declared once, as a `LocalConfig` field made with `settings.setting()` (the
same declaration the launch spec and the Serving Config node use): its type, default, help
and extras give the environment variable name, the conversion from JSON or env text, the
validation, and the reference table (`config_reference()`). The file is validated once,
when loaded; every problem is a LauncherError naming the key, the file or variable, and the fix.

Remote servers and their keys (by origin, never by prefix) are `remote_servers.py`; the
conversion of raw values and the error texts are `config_values.py`; the file's name and place
and the variables' prefix are errors/config_names.py (the client's messages name them too).
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from ...client.origins import origin
from ...client.transport import Deadlines
from ...errors import LauncherError
from ...errors.config_names import (CLI_CONFIG_DIR, CONFIG_FILE_NAME, CONFIG_VAR, ENV_PREFIX, comfy_user_dir,
                                    config_file_path, env_var, is_reserved_name)
from ...errors.redact import mask_env, mask_url_password
from .config_values import NotConvertible, convert, did_you_mean, env_error, expected, file_error, shown, type_word
from .remote_servers import (ENV_SERVER_NAME, LEGACY_KEYS_KEY, REMOTE_KEY_VAR, REMOTE_URL_VAR, RemoteServer,
                             remote_servers_from)
from .server_env import locate_server_program
from .settings import Setting, setting, settings_of

MACHINE_GPU_LOCK_DIR = "/tmp/vllm-omni-launcher-gpu-locks"     # one for every user: not TMPDIR, not the data dir
_DEADLINES = Deadlines()                                        # the client's defaults, which the settings take
__all__ = ["CONFIG_FILE_NAME", "ENV_PREFIX", "LocalConfig", "RemoteServer", "config_file_path", "config_reference",
           "default_data_dir", "load_local_config", "origin", "setting_env_var"]


# ---- the settings ---------------------------------------------------------------------------
# Declared with settings.setting(default, help, **extra); the extras this module reads:
#   env: the variable's name after the prefix ("" or absent = the key upper-cased, None = file only);
#   check(value) -> what is wrong, or ""; default_text / example / env_doc: the reference table's words.
def _port_range(value: Optional[int]) -> str:
    return "" if value is None or 0 < value < 65536 else "must be from 1 to 65535"


def _positive(value: Optional[float]) -> str:
    return "" if value is None or value > 0 else "must be greater than 0"


def _not_negative(value: float) -> str:
    return "" if value >= 0 else "must be 0 or more"


def _nonempty(value: Optional[str]) -> str:
    return "" if value is None or value.strip() else "must not be empty"


def _command(value: tuple[str, ...]) -> str:
    return "" if all(isinstance(part, str) and part for part in value) else "has an empty part"


def _proxy_url(value: Optional[str]) -> str:
    if value is None:
        return ""
    try:
        parts = urlsplit(value.strip())
        parts.port                      # noqa: B018 - raises on a bad port
    except ValueError:
        return "is not a URL like http://proxy:3128"
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return "must be an http:// or https:// proxy URL like http://proxy:3128"
    return ""


def _env_names(value: Mapping[str, str]) -> str:
    for name in value:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            return f"'{name}' is not an environment variable name"
        if is_reserved_name(name):
            return (f"'{name}' is reserved: the launcher makes a fresh VLLM_API_KEY per launch and never "
                    f"gives a server its own {ENV_PREFIX}* settings")
    return ""


@dataclass(frozen=True, repr=False)
class LocalConfig:
    """Settings owned by the machine's operator (see the module docstring for the rules)."""

    server_command: tuple[str, ...] = setting(
        (), "the server program, split like a shell (the launcher appends `serve MODEL --omni ...`)",
        env="SERVER_CMD", default_text="`vllm` on PATH", check=_command, example=["/opt/vllm-env/bin/vllm"])
    server_env: Optional[str] = setting(
        None, "venv made by `python -m vllm_omni_launcher setup` or `server/create_server_env.sh`; the launcher runs "
        "its `bin/vllm`", check=_nonempty,
        default_text="`~/.local/share/vllm-omni-launcher/server-env` (under `$XDG_DATA_HOME` when set) if it holds "
        "`bin/vllm`, else `vllm` on PATH", example="~/vllm-omni-env")
    host: str = setting("127.0.0.1", "bind address of launched servers", check=_nonempty)
    port: Optional[int] = setting(None, "port of launched servers", default_text="a free port per launch",
                                   check=_port_range, example=8091)
    trust_remote_code: bool = setting(False, "adds `--trust-remote-code`")
    data_dir: str = setting(
        "", "logs (`logs/`, last 10 per server kept), state files, job storage",
        default_text="`user/vllm_omni_launcher` in ComfyUI, else `~/.cache/vllm-omni-launcher`",
        example="~/vllm-omni-data")
    gpu_lock_dir: Optional[str] = setting(
        None, "the folder where every launcher process of every user on this machine locks the GPUs its server "
        "uses (one server per GPU); set the same folder for processes that do not share /tmp (a service with "
        "systemd's PrivateTmp, a container)", default_text=f"`{MACHINE_GPU_LOCK_DIR}`", check=_nonempty,
        example="/run/vllm-omni-gpu-locks")
    keep_alive_minutes: float = setting(0.0, "default idle stop; the node's value wins", default_text="0 (keep)",
                                         check=_not_negative, example=10)
    prestart_last_server: bool = setting(
        False, "when ComfyUI starts, start the server the last Local Server started (its model, LoRAs and serving "
        "choices, recorded in the data dir as `last_local_server.json`), so the first workflow finds it running "
        "or starting instead of waiting for the whole launch; it takes that server's GPU memory from ComfyUI's "
        "start on")
    startup_timeout_s: Optional[float] = setting(None, "give up waiting for ready after this long",
                                                  default_text="scaled by model size", check=_positive,
                                                  example=1800)
    hang_timeout_s: float = setting(120.0, "`/health` failing this long while the process lives: restart",
                                     check=_positive)
    # the client's own deadlines are the defaults (one place for the numbers; Deadlines.from_config reads these)
    connect_timeout_s: float = setting(_DEADLINES.connect_s, "deadline to connect to a server", check=_positive)
    first_byte_timeout_s: float = setting(_DEADLINES.first_byte_s, "deadline for a server's first response byte",
                                          check=_positive)
    body_timeout_s: float = setting(_DEADLINES.body_s, "deadline for a whole response body (video downloads)",
                                     check=_positive)
    max_batch_clips: int = setting(8, "most clips one Generate Batch node may ask for (prompts x batch_count): "
                                   "every decoded clip is held in memory until the node returns (TI2V-5B "
                                   "1280x704x121 is 1.3 GB)", check=_positive, example=16)
    max_clip_memory_gib: Optional[float] = setting(
        None, "most memory (GiB) one clip's decoded frames may take (ComfyUI's IMAGE, float32: 12 bytes per pixel "
        "per frame, frame interpolation included), and all of one Generate Batch's clips together (they are one "
        "IMAGE array); a larger request is refused before it is sent, so no workflow decides how much the "
        "launcher allocates", default_text="a quarter of this machine's RAM",
        check=_positive, example=32)
    replica_registration_host: str = setting(
        "127.0.0.1", "where `serve --accept-replicas PORT` binds the head's replica registration port and the "
        "sockets jobs travel on. UNAUTHENTICATED upstream: whoever reaches it can join as a replica and receive "
        "every prompt and image; set another address only on a network that only your GPU boxes share",
        check=_nonempty, example="10.0.0.5")
    allow_public_replica_registration: bool = setting(
        False, "let `replica_registration_host` be an address that is not private (not loopback, 10/8, "
        "172.16/12, 192.168/16, 100.64/10, link-local or fc00::/7), or a wildcard; without it such a head is "
        "refused. Set it only when a firewall already limits who reaches the registration and per-replica ports")
    replica_address: Optional[str] = setting(
        None, "`serve --join`: the address this box advertises to the head (`--omni-replica-address`)",
        default_text="upstream detects it", check=_nonempty, example="10.0.0.6")
    head_stall_timeout_s: float = setting(
        1800.0, "`serve --accept-replicas`: jobs waiting this long while nothing moves (no job changes status, "
        "no denoise on the head) means a wedged head: restart it. Set it above the longest job one replica runs",
        check=_positive, example=900)
    remote_servers: dict[str, RemoteServer] = setting(
        {}, "servers elsewhere, by name: `{\"gpu-box\": {\"url\": \"http://gpu-box:8091\", \"api_key\": \"...\"}}` "
        "(or `\"api_key_env\": \"VAR\"`); a key is sent only to its server's origin. The variables name one server "
        f"called `{ENV_SERVER_NAME}`. Also read: `{LEGACY_KEYS_KEY}` `{{\"http://gpu-box:8091\": \"key\"}}` "
        "(by origin; `\"*\"` is refused)", env=None, env_doc=f"`{REMOTE_URL_VAR}` + `{REMOTE_KEY_VAR}`")
    remote_proxy: Optional[str] = setting(
        None, "HTTP(S) proxy for remote servers (`http://proxy:3128`, `http://user:pass@proxy:3128`); never used "
        "for a server on this machine (loopback). The launcher never reads HTTP(S)_PROXY, ALL_PROXY or ~/.netrc "
        "from the environment, so this is the only proxy it uses", check=_proxy_url,
        default_text="none (remote servers are reached directly)", example="http://proxy:3128")
    extra_env: dict[str, str] = setting(
        {}, "extra environment for launched servers (e.g. `HF_HOME`, `HF_TOKEN`, `HF_HUB_OFFLINE`)", env=None,
        check=_env_names, example={"HF_HUB_OFFLINE": "1"})

    def __post_init__(self) -> None:
        for s in _settings():
            problem = _problem(s, getattr(self, s.name))
            if problem:
                raise LauncherError(f"The launcher setting '{s.name}' is not valid", problem,
                                    f"change '{s.name}'", setting=s.name, kind="config")

    def __repr__(self) -> str:
        """Field values with extra_env secrets masked and remote keys never shown."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["extra_env"] = mask_env(self.extra_env)
        if self.remote_proxy:
            values["remote_proxy"] = mask_url_password(self.remote_proxy)
        return "LocalConfig(" + ", ".join(f"{name}={value!r}" for name, value in values.items()) + ")"

    def resolved_server_command(self) -> list[str]:
        """The program that is `vllm`: explicit command, else the server venv's, else the default
        server env's (made by `setup`), else PATH (the rule and its errors: server_env.py)."""
        return list(locate_server_program(self.server_command, self.server_env).command)

    def key_variables(self) -> frozenset[str]:
        """The environment variables remote servers' keys are read from (`api_key_env`, and
        REMOTE_API_KEY for the `env` server): whatever their prefix, never passed to a launched
        server (environment.py), which could otherwise hand a remote server's key to anything it runs."""
        return frozenset(s.key_env for s in self.remote_servers.values() if s.key_env)

    def api_key_for(self, url: str) -> Optional[str]:
        """The key configured for `url`'s exact origin, else None (also for a URL that is not valid):
        a workflow's URL never receives a key the operator did not name for that origin."""
        try:
            wanted = origin(url)
        except LauncherError:
            return None
        return next((s.api_key for s in self.remote_servers.values() if s.api_key and s.origin == wanted), None)


# ---- reading the file and the environment --------------------------------------------------
@lru_cache(maxsize=1)
def _settings() -> tuple[Setting, ...]:
    return settings_of(LocalConfig)


def _problem(s: Setting, value: Any) -> str:
    """What is wrong with `value` for setting `s` (its declared check), or ""."""
    check = s.extra.get("check")
    return check(value) if check else ""


def _example(s: Setting, raw: Any) -> str:
    """A valid JSON value for `s`: the bad text converted when it parses (\"8091\" -> 8091)."""
    if isinstance(raw, str):
        try:
            return json.dumps(convert(s.hint, raw, True))
        except NotConvertible:
            pass
    value = s.extra.get("example", s.default)
    return json.dumps(value if value is not MISSING else {})


def _env_var(s: Setting) -> Optional[str]:
    """The variable declared for `s` (extra `env`: a name after the prefix, "" for the key upper-cased,
    None for a file-only setting), spelled by errors/config_names.env_var."""
    env = s.extra.get("env", "")
    return None if env is None else env_var(s.name, env)


def setting_env_var(name: str) -> str:
    """The variable of the setting called `name`, as its declaration gives it (a unit file or a
    message that sets it); a file-only setting or an unknown name raises KeyError."""
    var = next((_env_var(s) for s in _settings() if s.name == name), None)
    if var is None:
        raise KeyError(f"the launcher setting '{name}' has no environment variable")
    return var


def _read_file(path: Optional[Path]) -> dict[str, Any]:
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as exc:
        raise LauncherError(f"Cannot read the launcher config {path}", str(exc),
                            "fix the JSON at the place named above, or delete the file", setting="config",
                            kind="config") from exc
    if not isinstance(data, dict):
        raise LauncherError(f"The launcher config {path} is not a JSON object", f"it holds {shown(data)}",
                            'write an object such as {"server_env": "~/vllm-omni-env"}', setting="config",
                            kind="config")
    known = [s.name for s in _settings()] + [LEGACY_KEYS_KEY]
    for key in data:
        if key not in known:
            hint = did_you_mean(key, known)
            raise LauncherError(
                f"Unknown setting '{key}' in the launcher config {path}", "the launcher does not read it, so it "
                "would have no effect", f"{hint}Rename the key in {path}" if hint else
                f"remove it; the settings are: {', '.join(known)}", setting=key, kind="config")
    return data


def load_local_config(environ: Optional[Mapping[str, str]] = None) -> LocalConfig:
    """Read and validate the file (if any), then let environment variables override it."""
    env = os.environ if environ is None else environ
    path = config_file_path(env)
    data = _read_file(path)
    values: dict[str, Any] = {}
    for s in _settings():
        var = _env_var(s)
        if var and env.get(var, "").strip():
            values[s.name] = _parsed(s, env[var], var=var)
        elif s.name in data and s.name != "remote_servers":
            values[s.name] = _parsed(s, data[s.name], path=path)
    values["data_dir"] = values.get("data_dir") or default_data_dir()
    values["remote_servers"] = remote_servers_from(data, path, env)
    return LocalConfig(**values)


def _parsed(s: Setting, raw: Any, *, var: str = "", path: Optional[Path] = None) -> Any:
    """`raw` from env variable `var` (or from the file at `path`) converted and checked for setting `s`."""
    tp = s.hint
    try:
        value = convert(tp, raw, bool(var))
    except NotConvertible:
        why = f"'{s.name}' expects {expected(tp)}, got {shown(raw)}"
        bad = [k for k, v in raw.items() if isinstance(v, bool) or not isinstance(v, (str, int, float))] \
            if isinstance(raw, dict) else []
        if bad:
            why += f" ('{bad[0]}' is {shown(raw[bad[0]])}, not a string)"
        if var:
            raise env_error(var, s.name, why, f"set {var} to {expected(tp)}, or unset it") from None
        raise file_error(s.name, path, why, f"write \"{s.name}\": {_example(s, raw)} in {path}, or remove "
                          "the key to use the default") from None
    problem = _problem(s, value)
    if problem and var:
        raise env_error(var, s.name, f"'{s.name}' {problem}", f"change {var}, or unset it")
    if problem:
        raise file_error(s.name, path, f"'{s.name}' {problem}", f"change \"{s.name}\" in {path}")
    return value


# ---- where things live ---------------------------------------------------------------------
def default_gpu_lock_dir() -> str:
    """The machine's GPU lock folder when the config names none (gpu_lock.py says why there)."""
    return MACHINE_GPU_LOCK_DIR


def default_data_dir() -> str:
    """Where logs, state files and job storage go when the config names no data_dir: beside the config
    file in ComfyUI's user directory when ComfyUI loaded the pack, else ~/.cache (never by the current directory)."""
    user = comfy_user_dir()
    return str(user / "vllm_omni_launcher") if user else "~/.cache/vllm-omni-launcher"


# ---- documentation -------------------------------------------------------------------------
def config_reference() -> str:
    """The settings as a markdown table (variable, file key, type, default, meaning), for the README."""
    rows = ["| variable | file key | type | default | meaning |", "|---|---|---|---|---|",
            f"| `{CONFIG_VAR}` | — | path | `user/{CONFIG_FILE_NAME}` in ComfyUI, else "
            f"`{CLI_CONFIG_DIR}/{CONFIG_FILE_NAME}` | where this file is |"]
    for s in _settings():
        var = _env_var(s)
        env_text = s.extra.get("env_doc") or (f"`{var}`" if var else "—")
        default = s.extra.get("default_text") or _doc_default(s.default)
        rows.append(f"| {env_text} | `{s.name}` | {type_word(s.hint)} | {default} | {s.help} |")
    return "\n".join(rows)


def _doc_default(value: Any) -> str:
    if value is None or value is MISSING or value == {}:
        return "—"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{json.dumps(value) if isinstance(value, bool) else value}`"
