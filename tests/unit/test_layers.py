"""The layers stay apart: nothing under sandbox/ imports fleet, and nothing under agent/ imports
fleet, sandbox or lowio (the agent bundle ships agent/ alone). Low-level code both sides need
lives in `lowio`, which imports neither.

Every .py file is parsed, not imported, so an import inside a function, under `if
TYPE_CHECKING:`, a relative import that climbs out of its package, or `importlib.import_module`
/ `__import__` with a literal name is caught as surely as one at the top of the file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from repo_root import ROOT

# package directory -> top-level packages it must never import
FORBIDDEN = {
    "sandbox": {"fleet"},
    "agent": {"fleet", "sandbox", "lowio"},
    "lowio": {"fleet", "sandbox", "agent"},
}


def _module_name(path: Path) -> list[str]:
    """`sandbox/hub/store.py` -> ["sandbox", "hub", "store"]; an __init__ names its package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return parts


def _imported(tree: ast.AST, path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) for every import in the file, relative ones resolved; a
    relative import that climbs above the top-level package reads as "<outside>"."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                if node.level - 1 >= len(package):
                    found.append((node.lineno, "<outside>"))
                    continue
                kept = package[: len(package) - (node.level - 1)]
                base = ".".join([*kept, *([node.module] if node.module else [])])
            found.append((node.lineno, base))
            # `from . import fleet` at the top level, or `from x import y` naming a module
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names
                         if alias.name != "*")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and not first.value.startswith("."):
                found.append((node.lineno, first.value))
    return found


def _violations(package: str, forbidden: set[str]) -> list[str]:
    """"file:line: imports name", one per offending line (the shortest name on it)."""
    bad: dict[tuple[str, int], str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in _imported(tree, path):
            if name == "<outside>" or name.split(".")[0] in forbidden:
                key = (str(path.relative_to(ROOT)), line)
                bad[key] = min(bad.get(key, name), name, key=len)
    return [f"{file}:{line}: imports {name}" for (file, line), name in sorted(bad.items())]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(package: str) -> None:
    assert (ROOT / package).is_dir(), f"{package}/ is missing"
    bad = _violations(package, FORBIDDEN[package])
    assert not bad, (f"{package}/ must not import {', '.join(sorted(FORBIDDEN[package]))}:\n"
                     + "\n".join(bad))


def test_the_walker_sees_every_kind_of_import(tmp_path: Path, monkeypatch) -> None:
    """The checker itself: each way of reaching fleet from a sandbox module is reported."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    pkg = tmp_path / "sandbox" / "hub"
    pkg.mkdir(parents=True)
    (tmp_path / "sandbox" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(
        "import fleet\n"
        "import fleet.providers.store as s\n"
        "from fleet.directio import DirectWriter\n"
        "def f():\n"
        "    from fleet import store\n"
        "    import importlib\n"
        "    importlib.import_module('fleet.state.archive')\n"
        "from ... import fleet\n"
        "from .. import world\n"
        "from sandbox.fleet_toml import x\n"
    )
    bad = _violations("sandbox", {"fleet"})
    lines = sorted({int(b.split(":")[1]) for b in bad})
    assert lines == [1, 2, 3, 5, 7, 8], bad


# --- chains and circles: the imports that run (those under `if TYPE_CHECKING:` never do) -------

MAX_CHAIN = 8  # modules in the longest import chain within fleet/ (a `__main__` is a program
# that nothing imports, like the `fleet` script: it is not counted). 8 since every destroy goes
# through one path (`fleet.ops.destroy`), which sits under the rent (its undo of a box over
# budget): the loop -> rent -> destroy -> labels -> config -> cards
# A package that splits one unit by phase counts as one module: its __init__ composes the
# phases, each on a shared base, and that is no deeper layering (`fleet.ops.loop`).
ONE_UNIT = ("fleet.ops.loop",)


def _runtime_graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` that importing it runs first: what it imports, at
    the top or in a function, and the packages above each (an import runs their __init__)."""
    paths = {".".join(_module_name(p)): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []  # typing only: never imported at run time
        for _line, name in _imported(tree, path):
            parts = name.split(".")
            while parts and ".".join(parts) not in paths:
                parts.pop()
            while parts:
                target = ".".join(parts)
                if target != module and not module.startswith(target + "."):
                    graph[module].add(target)
                parts.pop()
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each set of modules that import one another, round and round (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            ring = []
            while True:
                w = stack.pop()
                ring.append(w)
                if w == v:
                    break
            if len(ring) > 1:
                found.append(sorted(ring))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports (the graph has no circle)."""
    best: dict[str, list[str]] = {}

    def chain(v: str) -> list[str]:
        if v not in best:
            best[v] = [v] + max((chain(w) for w in graph[v]), key=len, default=[])
        return best[v]

    return max((chain(v) for v in sorted(graph)), key=len)


@pytest.mark.parametrize("package", ["fleet", "agent", "sandbox"])
def test_no_import_circle(package: str) -> None:
    assert _circles(_runtime_graph(package)) == []


def test_the_longest_import_chain_in_fleet_is_short() -> None:
    def unit(m: str) -> str:
        return next((u for u in ONE_UNIT if m.startswith(u + ".")), m)

    graph: dict[str, set[str]] = {}
    for m, deps in _runtime_graph("fleet").items():
        if not m.endswith(".__main__"):
            graph.setdefault(unit(m), set()).update(unit(d) for d in deps if unit(d) != unit(m))
    assert _circles(graph) == [], "a circle has no longest chain"
    longest = _longest_chain(graph)
    assert len(longest) <= MAX_CHAIN, " -> ".join(longest)


def test_the_chain_walker_counts_packages_and_skips_typing_imports(tmp_path: Path,
                                                                   monkeypatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    pkg = tmp_path / "fleet" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "fleet" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from fleet import leaf\n")
    (tmp_path / "fleet" / "leaf.py").write_text("")
    (tmp_path / "fleet" / "top.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from fleet.sub import mod\n"
        "if TYPE_CHECKING:\n"
        "    from fleet import ring\n")
    (pkg / "mod.py").write_text("def f():\n    import fleet.ring\n")
    (tmp_path / "fleet" / "ring.py").write_text("from fleet import top\n")
    graph = _runtime_graph("fleet")
    # a module's own packages run before it anyway; another's run when it is imported
    assert graph["fleet.top"] == {"fleet.sub", "fleet.sub.mod"}
    assert graph["fleet.sub.mod"] == {"fleet.ring"}
    assert graph["fleet.sub"] == {"fleet.leaf"}
    assert _circles(graph) == [["fleet.ring", "fleet.sub.mod", "fleet.top"]]
