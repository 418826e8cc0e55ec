"""The science package's rooms and the way its imports run, read from the code itself (every import statement,
function-local ones included): the rooms stand in one order and each imports only from rooms before it, no two
modules import each other round a circle, the declarations load without torch, and lightning_modules never imports
orchestration."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCIENCE = ROOT / "lightning_modules"
# the flow, first room first: a room may import from itself and from the rooms before it
ROOMS = ["declarations", "data", "models", "training", "pruning"]


def _imports(path: Path) -> set[str]:
    """The dotted modules a file imports, wherever the import stands (relative ones resolved)."""
    pkg = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}  # `from package import module`
    return out


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts): p for p in SCIENCE.rglob("*.py")
            if p.name != "__init__.py"}


def test_every_science_module_lives_in_a_named_room():
    loose = [p.name for p in SCIENCE.glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"modules outside the rooms: {loose}"
    rooms = sorted(p.name for p in SCIENCE.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert rooms == sorted(ROOMS)
    for r in ROOMS:
        assert ast.get_docstring(ast.parse((SCIENCE / r / "__init__.py").read_text())), f"room {r} says nothing"


def test_rooms_import_one_way_and_nothing_imports_orchestration():
    back = []
    for name, path in _modules().items():
        room = ROOMS.index(name.split(".")[1])
        for dep in _imports(path):
            top = dep.split(".")
            assert top[0] != "orchestration", f"{name} imports {dep}"
            if top[0] == "lightning_modules" and len(top) > 1 and top[1] in ROOMS and ROOMS.index(top[1]) > room:
                back.append(f"{name} -> {dep}")
    assert back == [], "imports against the flow: " + "; ".join(sorted(back))


def test_no_import_circle():
    mods = _modules()
    graph = {m: {d for d in _imports(p) if d in mods and d != m} for m, p in mods.items()}
    # Tarjan's strongly connected components: a component of two or more modules is a circle
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert circles == []


def test_the_planted_circle_is_found():
    """The circle finder is not vacuous: the old pair (pruning ↔ stability) read from source text is a circle."""
    global _imports
    real = _imports
    fake = {"lightning_modules.pruning.run": {"lightning_modules.pruning.stability"},
            "lightning_modules.pruning.stability": {"lightning_modules.pruning.run"}}
    try:
        _imports = lambda p: fake.get(".".join(p.relative_to(ROOT).with_suffix("").parts), set())  # noqa: E731
        try:
            test_no_import_circle()
        except AssertionError:
            return
        raise AssertionError("a planted circle went unseen")
    finally:
        _imports = real


def test_declarations_load_without_torch():
    names = sorted(m for m in _modules() if m.split(".")[1] == "declarations")
    code = (f"import sys; [__import__(m) for m in {names!r}]; "
            "bad = [k for k in sys.modules if k.split('.')[0] in ('torch', 'transformers', 'pytorch_lightning')]; "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
