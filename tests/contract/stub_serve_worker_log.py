"""Worker-side log lines of the stub server, printed as the real worker modules would.

Every upstream line the stub prints is a copy declared once in ``upstream_lines.py``; importing
this module checks them all against the installed upstream and exits 3 naming the one that
drifted, so a stale copy fails the stub's start, not a parser test later.
"""
from __future__ import annotations

import logging
import sys

import upstream_lines

_UPSTREAM = upstream_lines.Finder()
try:
    _UPSTREAM.check(upstream_lines.installed_version())
except upstream_lines.MissingUpstreamLine as missing:
    sys.stderr.write(f"stub_vllm_serve.py: {missing}\n")
    raise SystemExit(3) from None


class WorkerLog:
    """Log records that look as if the real worker module had emitted them.

    ``separate_process`` mimics worker processes of the multi-process executor: their
    output carries no ``(APIServer pid=...)`` prefix, so it bypasses the decorated write.
    """

    def __init__(self, separate_process: bool) -> None:
        self.separate_process = separate_process

    def emit(self, key: str, level: int, *args: object) -> None:
        """Log upstream's line `key` (upstream_lines.LINES) with `args`, from the line of the real
        module's logging call; a line the installed upstream does not log raises MissingUpstreamLine."""
        line = upstream_lines.LINES[key]
        lineno = _UPSTREAM.line_of(line.module, line.message)
        mod = sys.modules.get(line.module)
        path = getattr(mod, "__file__", None) or upstream_lines.module_file(line.module)
        logger = logging.getLogger(line.module)
        if not logger.isEnabledFor(level):
            return
        record = logger.makeRecord(logger.name, level, path, lineno, line.message, args, None)
        if not self.separate_process:
            logger.handle(record)
            return
        node: logging.Logger | None = logger
        while node is not None:
            for handler in node.handlers:
                if record.levelno >= handler.level and hasattr(handler, "stream"):
                    stream = handler.stream
                    write = getattr(stream, "_original_write", stream.write)
                    write(handler.format(record) + "\n")
                    stream.flush()
                    return
            node = node.parent if node.propagate else None

    def raw_stderr(self):
        """stderr as a worker process would own it (undecorated)."""
        if not self.separate_process or not hasattr(sys.stderr, "_original_write"):
            return sys.stderr
        stream = sys.stderr

        class _Raw:
            def write(self, s: str) -> int:
                stream._original_write(s)
                return len(s)

            def flush(self) -> None:
                stream.flush()

            def isatty(self) -> bool:
                return stream.isatty()

            encoding = getattr(stream, "encoding", "utf-8")

        return _Raw()
