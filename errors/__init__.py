"""One error type whose text is written for the person looking at the ComfyUI node.

Every failure the launcher reports says what happened, why, and what the user can change
(naming the setting or flag), and keeps the raw upstream message so nothing is lost when
our explanation is wrong. Nodes raise these unchanged: ComfyUI shows `str(error)`.

The bottom layer, so every other one may use it; besides the error type it holds the text
rules all layers share (the package imports nothing of ours; its modules import only the
standard library):

* `redact`            which names are secret, masking them, and `untrusted_text` (a server's
                      words without control or invisible characters, capped).
* `failure_patterns`  the strings by which vLLM-Omni's output reveals a failure, written once.
* `config_names`      the names the local configuration is known by in messages: its file and
                      where it is, its variables, how to give a remote server its key.
"""
from __future__ import annotations


class LauncherError(Exception):
    """A user-facing failure.

    `setting` names the node widget or CLI flag the fix is about, when there is one.
    `raw` is the upstream text (server log tail, HTTP body) kept verbatim, under `raw_label`'s heading (our
    own detail, such as the planner's list of configurations, says whose words it is).
    `kind` is a stable machine-readable category (e.g. "refused", "oom_load") that code
    branches on; "" when no caller needs to tell this failure apart.
    """

    def __init__(self, what: str, why: str = "", fix: str = "", *, setting: str = "", raw: str = "",
                 kind: str = "", raw_label: str = "upstream said") -> None:
        self.what, self.why, self.fix, self.setting, self.raw, self.kind = what, why, fix, setting, raw, kind
        self.raw_label = raw_label
        super().__init__(self.text())

    def text(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.why:
            parts.append(f"Why: {self.why.rstrip('.')}.")
        if self.fix:
            parts.append(f"Fix: {self.fix.rstrip('.')}.")
        text = " ".join(parts)
        if self.raw:
            text += f"\n--- {self.raw_label} ---\n{self.raw.strip()}"
        return text


class SpecError(LauncherError, ValueError):
    """A launch configuration that must not start (caught before any process runs)."""
