"""The package's import graph: every module imports on its own, the supervisor never reaches the
registry, imports run one way between the layers (nodes/cli -> planner -> server -> models ->
client -> errors) and between server/'s subpackages (the order server/__init__.py states), and no
import forms a circle, TYPE_CHECKING and function-body imports included."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = "vllm_omni_launcher"
ROOT = Path(__file__).resolve().parents[2]
SKIP = {"__main__"}                     # runs the CLI when imported


def package_files() -> list[Path]:
    """The package's own source files (not tests, benches, environments)."""
    out = sorted(ROOT.glob("*.py"))
    for top in sorted(ROOT.iterdir()):
        if top.is_dir() and (top / "__init__.py").exists() and top.name != "tests":
            out += sorted(top.rglob("*.py"))
    return out


def modules() -> list[str]:
    out = []
    for path in package_files():
        rel = path.relative_to(ROOT)
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts and parts[-1] in SKIP:
            continue
        out.append(".".join([PACKAGE, *parts]))
    return out


# One fresh interpreter loads the third-party libraries once (the slow part), then forks one child per
# module: each child starts with none of the package loaded and imports only its module.
FORK_EACH = """
import importlib, json, os, sys, traceback
for lib in ("psutil", "requests", "numpy", "PIL.Image"):
    importlib.import_module(lib)
assert not [m for m in sys.modules if m.startswith("vllm_omni_launcher")]


def child(module):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            os._exit(0)
        except BaseException:
            os.write(write, traceback.format_exc()[-1500:].encode())
            os._exit(1)
    os.close(write)
    return pid, read


failed, running, todo = {}, {}, json.loads(sys.argv[1])
while todo or running:
    while todo and len(running) < 3:
        module = todo.pop()
        running[child(module)] = module
    (pid, read), module = next(iter(running.items()))
    with os.fdopen(read, "rb") as fh:
        err = fh.read().decode()
    _, status = os.waitpid(pid, 0)
    del running[(pid, read)]
    if status != 0:
        failed[module] = err or f"exit status {status}"
print(json.dumps(failed))
"""


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    names = modules()
    assert f"{PACKAGE}.server.supervision.supervisor" in names and f"{PACKAGE}.server.registry" in names
    done = subprocess.run([sys.executable, "-c", FORK_EACH, json.dumps(names)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}


def test_the_supervisor_does_not_import_the_registry() -> None:
    code = (f"import sys; import {PACKAGE}.server.supervision.supervisor; "
            f"print(sorted(m for m in sys.modules if m.startswith('{PACKAGE}.server.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    loaded = eval(done.stdout)           # noqa: S307 - our own printed list
    assert f"{PACKAGE}.server.registry" not in loaded and f"{PACKAGE}.server.supervision.adoption" not in loaded, loaded


# The layers, top first: a module imports only from its own top-level package or a lower layer.
# The package root (ComfyUI's entry) and __main__ (the CLI's) sit above them all.
LAYERS = [{"__init__", "__main__"}, {"nodes", "cli"}, {"planner"}, {"server"}, {"models"}, {"client"}, {"errors"}]
# The server subpackages that packages outside server/ may import (server/__init__.py says so).
SERVER_FROM_OUTSIDE = {"registry", "config", "launch", "storage"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
    return ".".join([PACKAGE, *parts])


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    """The package names `module` imports, with their line: module level, under TYPE_CHECKING and
    in function bodies alike (`from .x import y` names `.x.y`, which may be a module or a name)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module:
                found.append((target, node.lineno))
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            found += [(str(node.module), node.lineno)] + [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith(PACKAGE)]
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {package module it imports: line}, over the package's own source files."""
    files = {_module_name(path): path for path in package_files()}
    return {m: {t: line for t, line in _imports(p, m) if t in files and t != m} for m, p in files.items()}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if _top(module) in layer)


def layer_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports of a layer above the importer's, or of another package in the same layer (nodes <-> cli)."""
    return [f"{m}:{line} imports {t}" for m, targets in graph.items() for t, line in targets.items()
            if _top(m) != _top(t) and _layer(t) <= _layer(m)]


def server_order() -> list[str]:
    """server/'s parts, top first, as the table in server/__init__.py's docstring lists them."""
    doc = ast.get_docstring(ast.parse((ROOT / "server" / "__init__.py").read_text())) or ""
    return [m.group(1) for m in (re.match(r"^    (\w+)(?:/|\.py)\s{2,}", line) for line in doc.splitlines()) if m]


def server_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports against server/'s order: a part importing its own level or above, or a package outside
    server/ importing a part that is not one of its entry points."""
    order = server_order()
    part = {name: i for i, name in enumerate(order)}
    bad = []
    for m, targets in graph.items():
        for t, line in targets.items():
            if _top(t) != "server" or len(t.split(".")) < 3:
                continue
            target_part = t.split(".")[2]
            if _top(m) != "server":
                if target_part not in SERVER_FROM_OUTSIDE:
                    bad.append(f"{m}:{line} imports {t} (outside server/ only {sorted(SERVER_FROM_OUTSIDE)})")
                continue
            if len(m.split(".")) < 3:
                continue
            mine = m.split(".")[2]
            if mine != target_part and part[target_part] <= part[mine]:
                bad.append(f"{m}:{line} imports {t} ({target_part} is not below {mine}: {' > '.join(order)})")
    return bad


def circle(graph: dict[str, dict[str, int]]) -> list[str]:
    """One import circle (its modules, the first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def cycle_from(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = cycle_from(nxt)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return []

    for module in sorted(graph):
        if module not in state:
            found = cycle_from(module)
            if found:
                return found
    return []


def test_imports_run_down_the_layers() -> None:
    assert layer_violations(import_graph()) == []


def test_the_client_never_imports_the_server() -> None:
    graph = import_graph()
    assert [f"{m} -> {t}" for m, ts in graph.items() if _top(m) == "client" for t in ts if _top(t) == "server"] == []


def test_server_subpackages_import_down_the_order_its_docstring_states() -> None:
    order = server_order()
    on_disk = sorted(p.name if p.is_dir() else p.stem for p in (ROOT / "server").iterdir()
                     if (p / "__init__.py").exists() or (p.suffix == ".py" and p.stem != "__init__"))
    assert sorted(order) == on_disk, "server/__init__.py's table names every part of server/"
    assert server_violations(import_graph()) == []


def test_no_import_circle_type_checking_and_function_imports_included() -> None:
    assert circle(import_graph()) == []


def test_the_checks_fail_on_a_wrong_import() -> None:
    """Each rule, shown one import against it (the real graph with one edge added)."""
    def plus(module: str, target: str) -> dict[str, dict[str, int]]:
        graph = import_graph()
        graph[f"{PACKAGE}.{module}"] = {**graph[f"{PACKAGE}.{module}"], f"{PACKAGE}.{target}": 1}
        return graph

    assert layer_violations(plus("client.api", "server.registry"))
    assert layer_violations(plus("errors.redact", "models"))
    assert layer_violations(plus("nodes.session", "cli.report"))
    assert server_violations(plus("server.config.local_config", "server.process.probe"))
    assert server_violations(plus("planner.memory", "server.supervision.supervisor"))
    assert circle(plus("planner.memory_plan", "planner.memory"))
