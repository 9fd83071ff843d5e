"""Where the project's own files are.

`SHIPPED` is the folder an installed fleet carries (fleet/shipped/): the pyinfra deploys and
inventory, the testinfra checks and the scripts every box gets. In a checkout its entries are
links to `deploys/`, `inventory.py`, `tests/infra/` and `in/`, which stay where a person runs
them (`pyinfra inventory.py deploys/standing.py`); a wheel holds copies. `REPO` is the
checkout itself, for what only a checkout has (the demo's fleet.toml)."""

from __future__ import annotations

import os
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "shipped"
INVENTORY = SHIPPED / "inventory.py"
CHECKS = SHIPPED / "checks"
BOX_FILES = SHIPPED / "boxfiles"

REPO = Path(__file__).resolve().parents[2]


def sandbox_dir() -> Path:
    """The sandbox's folder (FLEET_SANDBOX_DIR, default `.sandbox`)."""
    return Path(os.environ.get("FLEET_SANDBOX_DIR", ".sandbox"))


def user_cache() -> Path:
    """The user's cache of fleet's own (`$XDG_CACHE_HOME/fleet`, else `~/.cache/fleet`): what
    any state folder may reuse, such as the agent's wheels."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleet"


# registry path -> the database fleet.toml's `fleet.database` names for that fleet
_DATABASES: dict[Path, str] = {}


def bind_database(registry: Path, url: str) -> None:
    _DATABASES[registry] = url


def database_url(registry: Path) -> str | None:
    """The database fleet.toml named for the fleet whose registry path is `registry` (None:
    the default, `fleet.state.db.url_for`)."""
    return _DATABASES.get(registry)
