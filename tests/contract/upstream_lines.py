"""The upstream log lines the stub server prints as if vLLM-Omni's own workers had printed them.

The launcher's log parser (server/logs/logwatch.py) reads the startup phases from lines such as
``Model loading took X GiB and Y seconds``; the stub (stub_vllm_serve.py) has no GPU workers, so
it prints those lines itself, through the real module loggers.  They are copies, and a copy
drifts silently when upstream rewords a line: the parser would then be tested against a line
the real server no longer prints.  So every line is declared once here (``LINES``: the module
that logs it and its message) and looked up in that module's real source: a logging call whose
message, with its ``%``-placeholders or f-string fields as ``{}``, is the copy's.  A copy that is
not found there raises :class:`MissingUpstreamLine`: the stub refuses to print it (its start
fails), and tests/unit/test_stub_upstream_lines.py checks every line against the installed
0.30 and against the 0.26 wheel that tests/run.sh downloads (read inside the zip, never installed).

``SERVED_LINES`` are lines the parser reads that the stub does not copy: upstream's own API layer,
which runs for real in the stub, prints them (e.g. the line that a job's MP4 is stored, the
client's last fast-poll hint). They are checked the same way, so a rewording upstream fails the
stub's start and the unit test instead of leaving the parser reading a line no server prints.

Standard library only: the stub imports this in the server environment, the unit test in the
ComfyUI-side one.
"""
from __future__ import annotations

import ast
import importlib.util
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

Version = tuple[int, int]

# The 0.26 line's wheel, as tests/run.sh downloads it (`pip download vllm-omni==0.26.0 --no-deps`).
WHEEL_DIR = Path(__file__).resolve().parents[2] / ".pytest_cache" / "upstream-wheels"
OLDER_LINE_WHEEL = "vllm_omni-0.26.0-py3-none-any.whl"


@dataclass(frozen=True)
class UpstreamLine:
    """A line a vLLM-Omni module logs: `message` with %-placeholders where upstream has values."""

    module: str
    message: str
    since: Version = (0, 26)       # the first supported line whose source has it
    moved_from: Optional[tuple[Version, str]] = None   # (v, module): lines before v log it from that module

    def module_in(self, version: Version) -> str:
        """The module that logs this line in `version`."""
        if self.moved_from is not None and version < self.moved_from[0]:
            return self.moved_from[1]
        return self.module


_WORKER = "vllm_omni.diffusion.worker.diffusion_worker"
_RUNNER = "vllm_omni.diffusion.worker.diffusion_model_runner"
LINES: dict[str, UpstreamLine] = {
    # startup: what logwatch.py reads its phases from (and the lines around them)
    "worker_initialized": UpstreamLine(_WORKER, "Worker %s: Initialized device and distributed environment."),
    "weights_loaded": UpstreamLine("vllm_omni.diffusion.model_loader.diffusers_loader",
                                   "Loading weights took %.2f seconds"),
    "model_loaded_size": UpstreamLine(_RUNNER, "Model loading took %.4f GiB and %.6f seconds"),
    "model_loaded": UpstreamLine(_RUNNER, "Model runner: Model loaded successfully."),
    "lazy_compile": UpstreamLine(_RUNNER, "Model runner: %s configured for lazy %s torch.compile with "
                                          "dynamic=%s; compilation errors may surface on the first request."),
    "runner_ready": UpstreamLine(_RUNNER, "Model runner: Initialization complete."),
    "worker_ready": UpstreamLine(_WORKER, "Worker %s: Initialization complete."),
    # per request
    "boundary_ratio_t2v": UpstreamLine("vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2",
                                       "boundary_ratio is required for T2V generation. using default value 0.875"),
    "boundary_ratio_i2v": UpstreamLine("vllm_omni.diffusion.models.wan2_2.pipeline_wan2_2_i2v",
                                       "boundary_ratio is required for I2V generation. using default value 0.875"),
    # the engine dying (the lines a crash leaves in the log before EngineDeadError)
    "workers_died": UpstreamLine("vllm_omni.diffusion.executor.multiproc_executor",
                                 "Diffusion worker(s) died unexpectedly: %s"),
    "device_unusable": UpstreamLine("vllm_omni.diffusion.executor.uniproc_executor",
                                    "Device context is unusable after a worker failure: %s", since=(0, 30)),
    "worker_dead": UpstreamLine("vllm_omni.diffusion.executor.uniproc_executor",
                                "Diffusion worker failed unrecoverably in-process; marking the executor dead.",
                                since=(0, 30)),
}

# Printed by upstream's own API layer (real in the stub too), read by server/logs/logwatch.py.
SERVED_LINES: dict[str, UpstreamLine] = {
    # logged right after the job's MP4 is saved, just before its status turns completed (_run_video_generation_job)
    "video_stored": UpstreamLine("vllm_omni.entrypoints.openai.video.generation.helpers",
                                 "Video request %s persisted %s output file.",
                                 moved_from=((0, 30), "vllm_omni.entrypoints.openai.api_server")),
}

_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception", "critical",
                "debug_once", "info_once", "warning_once"}
_PERCENT = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa]")


class MissingUpstreamLine(LookupError):
    """A copied line that the real upstream module does not log (reworded, moved or removed)."""


def template(message: str) -> str:
    """A %-format message with every placeholder as ``{}`` (``%%`` as ``%``)."""
    return "%".join(_PERCENT.sub("{}", part) for part in message.split("%%"))


def _call_template(node: ast.expr) -> Optional[str]:
    """The message of a logging call's first argument as a template, or None if it is not a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return template(node.value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{}")
        return "".join(parts)
    return None


def logged_messages(source: str) -> dict[str, int]:
    """{message template: line of the logging call} for every literal message a module logs.
    The line is the call's first line, the one Python's logging records."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LOG_METHODS and node.args):
            text = _call_template(node.args[0])
            if text is not None:
                found.setdefault(text, node.lineno)
    return found


def module_file(module: str) -> str:
    """The installed source file of `module`, found without importing it or its packages (importing
    vllm_omni's packages costs seconds and would run before the stub's seams are in place)."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)            # a top-level name: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise MissingUpstreamLine(f"package {top} is not installed here")
    base = Path(list(spec.submodule_search_locations)[0], *rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return str(candidate)
    raise MissingUpstreamLine(f"module {module} is not installed here ({base}.py)")


def wheel_reader(wheel: Path) -> Callable[[str], str]:
    """Read a module's source from inside a wheel (no install)."""
    archive = zipfile.ZipFile(wheel)

    def read(module: str) -> str:
        name = module.replace(".", "/") + ".py"
        try:
            return archive.read(name).decode("utf-8")
        except KeyError:
            raise MissingUpstreamLine(f"{wheel.name} has no {name}") from None
    return read


def installed_reader(module: str) -> str:
    return Path(module_file(module)).read_text(encoding="utf-8")


class Finder:
    """Looks copied lines up in one upstream's sources (installed, or a wheel), each module parsed once."""

    def __init__(self, read: Callable[[str], str] = installed_reader, where: str = "the installed vLLM-Omni"):
        self._read = read
        self._where = where
        self._modules: dict[str, dict[str, int]] = {}

    def line_of(self, module: str, message: str) -> int:
        """The source line of the logging call in `module` that logs `message`; raises MissingUpstreamLine."""
        if module not in self._modules:
            self._modules[module] = logged_messages(self._read(module))
        wanted = template(message)
        line = self._modules[module].get(wanted)
        if line is None:
            raise MissingUpstreamLine(
                f"{module} in {self._where} logs no line {wanted!r}: the stub's copy of an upstream log line "
                "has drifted; copy the real line into tests/contract/upstream_lines.py (and check that "
                "server/logs/logwatch.py still reads it)")
        return line

    def check(self, version: Version) -> dict[str, int]:
        """Every line of LINES and SERVED_LINES that `version` has: {key: line}; raises on the first one not found."""
        return {key: self.line_of(u.module_in(version), u.message)
                for key, u in {**LINES, **SERVED_LINES}.items() if version >= u.since}


def installed_version() -> Version:
    """major.minor of the installed vllm-omni."""
    from importlib.metadata import version

    major, minor = version("vllm-omni").split(".")[:2]
    return int(major), int(minor)
