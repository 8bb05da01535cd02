"""The worker log lines the stub server prints in place of vLLM-Omni's own workers are upstream's
lines: each one (tests/contract/upstream_lines.py) is logged by its module in the installed 0.30
and, where the 0.26 line has it, in the 0.26 wheel; a reworded copy is caught; every line the
stub emits is one of them; and the lines the log parser reads its startup phases from give the
phases it means. The lines upstream's API layer prints itself and the parser reads (SERVED_LINES:
the stored-MP4 line, the client's last fast-poll hint) are checked in both lines the same way."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Callable

import pytest

import upstream_lines
from upstream_lines import LINES, SERVED_LINES, MissingUpstreamLine, UpstreamLine
from vllm_omni_launcher.client.poll_window import Hint
from vllm_omni_launcher.server.launch.versions import SUPPORTED
from vllm_omni_launcher.server.logs import logwatch

STUB = Path(upstream_lines.__file__).with_name("stub_vllm_serve.py")
# the stub's source: its entry point and the modules it is split into (stub_serve_*.py)
STUB_SOURCE = "\n".join(p.read_text() for p in [STUB, *sorted(STUB.parent.glob("stub_serve_*.py"))])
OLDER_LINE = SUPPORTED[0]
CHECKED = {**LINES, **SERVED_LINES}


@pytest.fixture(scope="module")
def installed(server_env_python: str) -> upstream_lines.Finder:
    """The server environment's vLLM-Omni sources, read as files (nothing of it is imported)."""
    site = Path(subprocess.run([server_env_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    version = subprocess.run([server_env_python, "-c", "from importlib.metadata import version; "
                              "print(version('vllm-omni'))"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("0.30."), f"the server environment runs vLLM-Omni {version}, not the pinned 0.30"
    return upstream_lines.Finder(_files_under(site), f"the server environment ({site})")


def _files_under(site: Path) -> Callable[[str], str]:
    def read(module: str) -> str:
        path = site.joinpath(*module.split(".")).with_suffix(".py")
        if not path.is_file():
            raise MissingUpstreamLine(f"{path} does not exist")
        return path.read_text(encoding="utf-8")
    return read


@pytest.fixture(scope="module")
def wheel_0_26() -> upstream_lines.Finder:
    wheel = upstream_lines.WHEEL_DIR / upstream_lines.OLDER_LINE_WHEEL
    if not wheel.is_file():
        pytest.skip(f"needs the vLLM-Omni 0.26 wheel at {wheel}: tests/run.sh downloads it "
                    "(pip download vllm-omni==0.26.0 --no-deps)")
    return upstream_lines.Finder(upstream_lines.wheel_reader(wheel), wheel.name)


def test_the_wheel_is_the_older_supported_line_and_the_one_run_sh_downloads() -> None:
    assert upstream_lines.OLDER_LINE_WHEEL.startswith(f"vllm_omni-{OLDER_LINE[0]}.{OLDER_LINE[1]}.")
    version = upstream_lines.OLDER_LINE_WHEEL.split("-")[1]
    run_sh = (Path(__file__).resolve().parents[1] / "run.sh").read_text()
    assert f'"vllm-omni=={version}"' in run_sh and f"/{upstream_lines.OLDER_LINE_WHEEL}" in run_sh
    assert '"$root/.pytest_cache/upstream-wheels"' in run_sh and upstream_lines.WHEEL_DIR.parts[-2:] == (
        ".pytest_cache", "upstream-wheels")


@pytest.mark.parametrize("key", sorted(CHECKED))
def test_every_copied_line_is_logged_by_its_module_in_0_30(installed, key: str) -> None:
    line = CHECKED[key]
    assert installed.line_of(line.module_in((0, 30)), line.message) > 0


@pytest.mark.parametrize("key", sorted(k for k, line in CHECKED.items() if line.since <= OLDER_LINE))
def test_every_copied_line_the_0_26_line_has_is_logged_by_its_module_there(wheel_0_26, key: str) -> None:
    line = CHECKED[key]
    assert wheel_0_26.line_of(line.module_in(OLDER_LINE), line.message) > 0


def test_the_line_recorded_is_the_logging_calls_first_line_as_in_a_real_log(wheel_0_26) -> None:
    # tests/fixtures/logs/vllm-omni-0.26-serve-ti2v-tiny-1gpu.log, printed by the real 0.26 server
    real_log = (Path(__file__).resolve().parents[1] / "fixtures" / "logs" /
                "vllm-omni-0.26-serve-ti2v-tiny-1gpu.log").read_text()
    for key, where in (("weights_loaded", "diffusers_loader.py"), ("model_loaded_size", "diffusion_model_runner.py"),
                       ("worker_initialized", "diffusion_worker.py"), ("lazy_compile", "diffusion_model_runner.py"),
                       ("video_stored", "api_server.py")):
        line = CHECKED[key]
        assert f"[{where}:{wheel_0_26.line_of(line.module_in(OLDER_LINE), line.message)}]" in real_log, key


@pytest.mark.parametrize("wrong", [
    UpstreamLine(LINES["model_loaded_size"].module, "Model loading took %.4f GB and %.6f seconds"),   # reworded
    UpstreamLine(LINES["worker_initialized"].module, "Worker %s: Initialised device and distributed environment."),
    UpstreamLine(LINES["weights_loaded"].module, "Loading weights took %.2f seconds."),               # one char more
    UpstreamLine(LINES["model_loaded"].module, LINES["weights_loaded"].message),                       # wrong module
    UpstreamLine("vllm_omni.diffusion.worker.no_such_module", LINES["model_loaded"].message),
])
def test_a_line_upstream_does_not_log_is_refused_in_both_lines(installed, wheel_0_26, wrong: UpstreamLine) -> None:
    for finder in (installed, wheel_0_26):
        with pytest.raises(MissingUpstreamLine) as caught:
            finder.line_of(wrong.module, wrong.message)
        if "no_such_module" not in wrong.module:
            assert "has drifted" in str(caught.value) and upstream_lines.template(wrong.message) in str(caught.value)


def test_a_missing_line_fails_the_whole_check(installed, monkeypatch) -> None:
    monkeypatch.setitem(LINES, "model_loaded_size",
                        UpstreamLine(LINES["model_loaded_size"].module, "Model loaded: %.4f GiB in %.6f seconds"))
    with pytest.raises(MissingUpstreamLine, match="Model loaded: {} GiB in {} seconds"):
        installed.check((0, 30))


def test_placeholders_and_fstring_fields_compare_as_one_kind_of_hole() -> None:
    assert upstream_lines.template("took %.2f s, %d of %s (100%%)") == "took {} s, {} of {} (100%)"
    found = upstream_lines.logged_messages('logger.info(f"Worker {self.rank}: up.")\n'
                                           'log.warning(\n    "a %s "\n    "b %.1f", x, y)\nprint("not a log")\n')
    assert found == {"Worker {}: up.": 1, "a {} b {}": 2}


def _emitted_keys() -> list[str]:
    """The first argument of every `.emit(...)` call in the stub."""
    keys = []
    for node in ast.walk(ast.parse(STUB_SOURCE)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "emit":
            first = node.args[0]
            if isinstance(first, ast.IfExp):
                keys += [first.body.value, first.orelse.value]           # type: ignore[attr-defined]
            else:
                assert isinstance(first, ast.Constant), ast.unparse(node)
                keys.append(first.value)
    return keys


def test_every_line_the_stub_emits_is_a_checked_one_and_every_checked_one_is_emitted() -> None:
    keys = _emitted_keys()
    assert set(keys) <= set(LINES), set(keys) - set(LINES)
    assert not set(SERVED_LINES) & set(LINES), "upstream's API layer prints these in the stub: never copied"
    assert set(keys) == set(LINES), f"declared but never printed: {set(LINES) - set(keys)}"
    assert STUB_SOURCE.count("makeRecord(") == 1, \
        "the stub makes upstream log records in WorkerLog.emit only"


@pytest.mark.parametrize("key, args, phase, text", [
    ("worker_initialized", (0,), logwatch.LOADING, "Starting GPU workers"),
    ("weights_loaded", (1.25,), logwatch.LOADING, "Weights read in 1.25 s"),
    ("model_loaded_size", (9.5, 12.0), logwatch.LOADING, "Model loaded (9.5000 GiB in 12.000000 s)"),
    ("lazy_compile", ("transformer", "regional", True), logwatch.WARMUP,
     "Model loaded; torch.compile is on, so the warm-up compiles kernels (minutes)"),
])
def test_the_parser_reads_its_phases_from_the_upstream_lines(key, args, phase, text) -> None:
    printed = "INFO 12-02 10:00:00 [diffusion_model_runner.py:242] " + LINES[key].message % args
    change = logwatch.parse_phase(printed)
    assert change is not None and (change.phase, change.text) == (phase, text)


def test_the_parser_reads_the_stored_line_as_the_job_completing_next() -> None:
    """Upstream's stored-MP4 line, as 0.30's helpers.py prints it, after a run's last step: the STORED hint."""
    tracker = logwatch.ProgressTracker()
    tracker.mark_server_up()
    tracker.feed("100%|██████████| 4/4 [00:07<00:00,  1.76s/it]")
    job = "video_gen_0123456789abcdef0123456789abcdef"
    printed = "(APIServer pid=914) INFO 12-02 10:00:00 [helpers.py:432] " + SERVED_LINES["video_stored"].message % (
        job, job)
    assert tracker.feed(printed) and tracker.current().hint_after(0) == Hint.STORED
