"""`inventory.py` is a file pyinfra loads, outside the packages the import contracts see
(pyproject.toml): it reaches the fleet alone (`inventory.py -> fleet`), below its commands and
its page, and never the pyinfra side (deploys, operations, facts), the agent or the sandbox."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

INVENTORY = Path(__file__).resolve().parents[2] / "inventory.py"
FORBIDDEN = ("fleet.cli", "fleet.page")


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"a relative import in {path.name}"
            found.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_inventory_imports_the_fleet_below_its_commands_and_nothing_else_of_ours() -> None:
    imported = _imports(INVENTORY)
    ours = [name for name in imported if name.split(".")[0] not in sys.stdlib_module_names]
    assert ours and all(name.split(".")[0] == "fleet" for name in ours), ours
    assert not [name for name in ours if name.startswith(FORBIDDEN)], ours
