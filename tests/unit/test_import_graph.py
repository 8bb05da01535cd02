"""The package's import graph: every module imports on its own, the supervisor never reaches the
registry, and the module-level imports form no circle (issue 12)."""
from __future__ import annotations

import ast
import json
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
    assert f"{PACKAGE}.server.supervisor" in names and f"{PACKAGE}.server.registry" in names
    done = subprocess.run([sys.executable, "-c", FORK_EACH, json.dumps(names)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}


def test_the_supervisor_does_not_import_the_registry() -> None:
    code = (f"import sys; import {PACKAGE}.server.supervisor; "
            f"print(sorted(m for m in sys.modules if m.startswith('{PACKAGE}.server.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    loaded = eval(done.stdout)           # noqa: S307 - our own printed list
    assert f"{PACKAGE}.server.registry" not in loaded and f"{PACKAGE}.server.adoption" not in loaded, loaded


def _module_level_imports(path: Path, module: str) -> set[str]:
    """Package modules `module` imports at import time (TYPE_CHECKING blocks and function bodies excluded)."""
    tree = ast.parse(path.read_text())
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module:
                    found.add(target)
                for alias in node.names:
                    found.add(f"{target}.{alias.name}")
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith(PACKAGE))
    visit(tree.body)
    return found


def test_no_import_circle() -> None:
    files = {}
    for path in package_files():
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        files[".".join([PACKAGE, *parts])] = path
    graph = {m: {t for t in _module_level_imports(p, m) if t in files and t != m} for m, p in files.items()}
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
            assert not found, " -> ".join(found)
