"""`prestart_last_server`: start, when ComfyUI loads the pack, the server the last Local Server started.

The first clip after ComfyUI starts paid the whole launch when its workflow was queued. Local Server
records its choices (last_choices.py, into server/storage/last_server.py's file); with the setting on,
`maybe_start` rebuilds them and runs Local Server's own launch path (session.launch_local) in a daemon
thread, so the spec and fingerprint are the same and a Local Server queued meanwhile waits on the
registry's start lock, saying so (prestart_wait.py), then reuses the server. It never raises into
ComfyUI's import and never blocks it; a record that cannot be used starts nothing and says why in one
console line.
"""
from __future__ import annotations

import threading
from typing import Any, Optional

from ..errors import LauncherError
from ..server.config.local_config import LocalConfig, load_local_config
from ..server.storage import last_server
from . import prestart_wait, progress
from .handles import ModelChoice, ServingChoice
from .last_choices import LOG, PREFIX, choices
from .session import launch_local

THREAD_NAME = "vllm-omni-prestart"


class ConsoleReporter(progress.NodeReporter):
    """A reporter for a launch no node runs: the node texts stay off the console (the start and the
    outcome are one line each), and ComfyUI's Cancel is a queued prompt's, not this start's."""

    def __init__(self) -> None:
        super().__init__(None)

    def text(self, text: str) -> None:
        LOG.debug("%s %s", PREFIX, text)

    def bar(self, value: float, total: float) -> None:
        pass

    def cancel_requested(self) -> bool:
        return False


def maybe_start(config: Optional[LocalConfig] = None) -> Optional[threading.Thread]:
    """With the setting on and a usable record, start the recorded server in a daemon thread (returned,
    for tests); otherwise None. Never raises: ComfyUI is importing the pack."""
    try:
        config = config or load_local_config()
    except Exception as exc:   # noqa: BLE001 - ComfyUI is importing the pack: say it, never raise into it
        print(f"{PREFIX} not starting: {exc}", flush=True)
        return None
    if not config.prestart_last_server:
        return None
    try:
        entry = last_server.read(config.data_dir)
        model, serving = choices(entry)
    except FileNotFoundError:
        return None
    except Exception as exc:   # noqa: BLE001 - a record we cannot use (or cannot read) starts nothing
        print(f"{PREFIX} not starting: the record {last_server.record_path(config.data_dir)} cannot be used: "
              f"{str(exc).rstrip('.')}. Queue a Local Server to record a new one, or turn {last_server.SETTING} "
              "off", flush=True)
        return None
    thread = threading.Thread(target=_start, args=(model, serving, entry, config), daemon=True,
                              name=THREAD_NAME)
    thread.start()
    return thread


def _start(model: ModelChoice, serving: ServingChoice, entry: dict[str, Any], config: LocalConfig) -> None:
    def announce(plan: Any) -> None:
        prestart_wait.planned(plan.spec.fingerprint())
        summary = " ".join(plan.spec.flags()) or "default serving"
        print(f"{PREFIX} starting {model.label or model.model} ({summary}) as the last Local Server did", flush=True)

    try:
        with prestart_wait.running():   # a Local Server queued meanwhile says it waits for this start
            sup, _plan, _loras = launch_local(model, serving, config, ConsoleReporter(), cfg=entry["cfg"],
                                              queued_jobs=entry["queued_jobs"], on_plan=announce)
        print(f"{PREFIX} ready at {sup.url} (log {sup.log_path})", flush=True)
    except LauncherError as err:
        print(f"{PREFIX} failed: {err}", flush=True)
    except BaseException as exc:   # noqa: BLE001 - a daemon thread's error must reach the console, not vanish
        print(f"{PREFIX} failed: {type(exc).__name__}: {exc}", flush=True)
