"""Remote servers the operator names, each with the key that goes to its origin and nowhere else.

A shared workflow chooses the URL a Remote Server node connects to, so a key may only go to a
server the local configuration names with that key, compared by ORIGIN (client/origins.py says
what an origin is and why not a prefix). There is no "any URL" key: "*" is refused, and the
environment's key applies only to the URL set beside it. This module reads the three ways of
naming them (`remote_servers`, the older `remote_api_keys` by origin, and the two variables) into
one map by name, and refuses two entries for one origin with different keys. Remote Server's list, its
cache identity and the server a node or handle reaches (`remote_target`) read that map here too.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

from ...client.origins import origin
from ...errors import LauncherError
from ...errors.config_names import CONFIG_FILE_NAME, REMOTE_KEY_VAR, REMOTE_URL_VAR
from .config_values import did_you_mean, env_error, file_error, shown

ENV_SERVER_NAME = "env"            # the remote server the two variables above describe
LEGACY_KEYS_KEY = "remote_api_keys"
ENTRY_KEYS = ("url", "api_key", "api_key_env")
USE_URL = "(use url)"              # Remote Server: no configured server picked, the url widget applies


@dataclass(frozen=True, repr=False)
class RemoteServer:
    """A server elsewhere that the operator named; its key goes to its origin and nowhere else."""

    name: str
    url: str
    api_key: Optional[str] = None
    # The environment variable the key was read from (api_key_env), withheld from launched servers;
    # where a key came from is not part of which server it is.
    key_env: Optional[str] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        origin(self.url)   # refuses userinfo, bad schemes and hosts before the server is usable

    @property
    def origin(self) -> str:
        return origin(self.url)

    def __repr__(self) -> str:
        key = "'***'" if self.api_key else None
        return f"RemoteServer(name={self.name!r}, url={self.url!r}, api_key={key})"


def remote_servers_from(data: Mapping[str, Any], path: Optional[Path], env: Mapping[str, str]) -> dict[str, RemoteServer]:
    """remote_servers, remote_api_keys and the REMOTE_URL/REMOTE_API_KEY pair, as one map by name."""
    servers: dict[str, RemoteServer] = {}
    raw = data.get("remote_servers") or {}
    if not isinstance(raw, dict):
        raise file_error("remote_servers", path, f"'remote_servers' expects an object of names, got {shown(raw)}",
                          'write "remote_servers": {"gpu-box": {"url": "http://gpu-box:8091", "api_key": "..."}}')
    for name, entry in raw.items():
        servers[name] = _named_server(name, entry, path, env)
    legacy = data.get(LEGACY_KEYS_KEY) or {}
    if not isinstance(legacy, dict):
        raise file_error(LEGACY_KEYS_KEY, path, f"'{LEGACY_KEYS_KEY}' expects an object of origin -> key",
                          f'write "{LEGACY_KEYS_KEY}": {{"http://gpu-box:8091": "..."}}, or use remote_servers')
    for url, key in legacy.items():
        if url.strip() == "*" or "*" in url:
            raise file_error(
                LEGACY_KEYS_KEY, path, f"it has a \"{url}\" entry, a key for any server; keys go only to the origins "
                "the operator names, because a shared workflow chooses the URL a Remote Server node connects to",
                f"replace \"{url}\" with the server's origin, e.g. \"http://gpu-box:8091\", or use remote_servers")
        if not isinstance(key, str) or not key:
            raise file_error(LEGACY_KEYS_KEY, path, f"the key for '{url}' is not a non-empty string",
                              "write the key as a string")
        name = _checked_origin(url, LEGACY_KEYS_KEY, path)
        servers.setdefault(name, RemoteServer(name, url.strip(), key))
    url, key = env.get(REMOTE_URL_VAR, "").strip(), env.get(REMOTE_KEY_VAR, "").strip()
    if key and not url:
        raise LauncherError(
            f"{REMOTE_KEY_VAR} is set without {REMOTE_URL_VAR}",
            "a remote API key is sent only to the server origin configured beside it, never to whatever URL a "
            "shared workflow names", f"set {REMOTE_URL_VAR} to that server's origin (e.g. http://gpu-box:8091), "
            f"or configure it under \"remote_servers\" in {path}", setting=REMOTE_URL_VAR, kind="config")
    if url:
        try:
            servers[ENV_SERVER_NAME] = RemoteServer(ENV_SERVER_NAME, url, key or None, REMOTE_KEY_VAR)
        except LauncherError as exc:
            raise env_error(REMOTE_URL_VAR, "remote_servers", exc.why, f"set {REMOTE_URL_VAR} to the server's "
                             "origin, e.g. http://gpu-box:8091, or unset it") from None
    _refuse_conflicts(servers)
    return servers


def _named_server(name: str, entry: Any, path: Optional[Path], env: Mapping[str, str]) -> RemoteServer:
    where = f"remote_servers.{name}"
    if not name.strip() or not isinstance(entry, dict):
        raise file_error("remote_servers", path, f"'{where}' must be an object with a \"url\"",
                          f'write "{name or "gpu-box"}": {{"url": "http://gpu-box:8091", "api_key": "..."}}')
    for key in entry:
        if key not in ENTRY_KEYS:
            raise file_error("remote_servers", path, f"'{where}' has an unknown key '{key}'",
                             did_you_mean(key, ENTRY_KEYS) + "the keys are url, api_key or api_key_env")
    url = entry.get("url")
    if not isinstance(url, str):
        raise file_error("remote_servers", path, f"'{where}' has no \"url\" string",
                          f'add "url": "http://gpu-box:8091" to "{name}"')
    _checked_origin(url, where, path)
    if "api_key" in entry and "api_key_env" in entry:
        raise file_error("remote_servers", path, f"'{where}' has both api_key and api_key_env",
                          "keep one of them")
    key, var = entry.get("api_key"), None
    if "api_key_env" in entry:
        var = entry["api_key_env"]
        key = env.get(var, "").strip() if isinstance(var, str) else ""
        if not key:
            raise file_error("remote_servers", path, f"'{where}' takes its key from the environment variable "
                              f"{var!r}, which is not set", f"export {var} before starting ComfyUI, or remove "
                              "api_key_env")
    if key is not None and (not isinstance(key, str) or not key):
        raise file_error("remote_servers", path, f"the api_key of '{where}' is not a non-empty string",
                          "write the key as a string, or remove api_key for a server without one")
    return RemoteServer(name, url.strip(), key, var)


def _checked_origin(url: Any, where: str, path: Optional[Path]) -> str:
    try:
        return origin(url)
    except LauncherError as exc:
        raise file_error(where.partition(".")[0], path, f"'{where}': {exc.what}: {exc.why}", exc.fix) from None


def _refuse_conflicts(servers: Mapping[str, RemoteServer]) -> None:
    """Two entries for one origin with different keys: which one to send would be a guess."""
    seen: dict[str, RemoteServer] = {}
    for server in servers.values():
        other = seen.setdefault(server.origin, server)
        if other is not server and server.api_key and other.api_key and server.api_key != other.api_key:
            raise LauncherError(
                f"Remote servers '{other.name}' and '{server.name}' have the same origin {server.origin} but "
                "different keys", "the launcher cannot tell which key that server expects",
                f"keep one entry per origin ({'remote_servers'}, {LEGACY_KEYS_KEY} and {REMOTE_URL_VAR})",
                setting="remote_servers", kind="config")


# ----------------------------------------------------------------------------- Remote Server's choice
class RemoteConfig(Protocol):
    """What the choice below reads of the local config (local_config.LocalConfig, which imports this module)."""

    @property
    def remote_servers(self) -> Mapping[str, RemoteServer]: ...

    def api_key_for(self, url: str) -> Optional[str]: ...


def remote_choices(load: Callable[[], RemoteConfig]) -> list[str]:
    """Remote Server's list: 'use the url', then the servers the config (read by `load`) names."""
    try:
        names = sorted(load().remote_servers)
    except LauncherError:
        names = []          # a broken config is reported when the node runs, not by hiding the node
    return [USE_URL, *names]


def remote_identity(load: Callable[[], RemoteConfig], url: str, remote_name: str) -> str:
    """What a Remote Server node stands for: the configured URL of a named server, else the url
    widget (fingerprint_inputs: editing the config's URL for a name re-runs the node). Never raises."""
    if remote_name and remote_name != USE_URL:
        try:
            server = load().remote_servers.get(remote_name)
        except LauncherError:
            server = None
        return f"{remote_name}={server.url if server is not None else ''}"
    return url.strip()


def remote_target(config: RemoteConfig, url: str, remote_name: str) -> tuple[str, str, Optional[str]]:
    """(configured name or "", base URL, key). A typed URL gets a key only when the local
    config names its origin; a configured name brings its own URL and key."""
    if remote_name and remote_name != USE_URL:
        server = config.remote_servers.get(remote_name)
        if server is None:
            raise LauncherError(
                f"Remote Server got {shown(remote_name)} as remote_server, which is not configured on this machine",
                "Remote Server lists the servers named in this machine's launcher config (remote_servers)",
                f"add that server to remote_servers in {CONFIG_FILE_NAME}, or pick "
                f"'{USE_URL}' and type the server's URL", setting="remote_server")
        return remote_name, server.url.rstrip("/"), server.api_key
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    origin(base)            # refuses anything that is not an http(s) URL with a host, naming the widget
    return "", base, config.api_key_for(base)
