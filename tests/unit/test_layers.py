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

ROOT = Path(__file__).resolve().parents[2]

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
        "import fleet.store as s\n"
        "from fleet.directio import DirectWriter\n"
        "def f():\n"
        "    from fleet import store\n"
        "    import importlib\n"
        "    importlib.import_module('fleet.archive')\n"
        "from ... import fleet\n"
        "from .. import world\n"
        "from sandbox.fleet_toml import x\n"
    )
    bad = _violations("sandbox", {"fleet"})
    lines = sorted({int(b.split(":")[1]) for b in bad})
    assert lines == [1, 2, 3, 5, 7, 8], bad
