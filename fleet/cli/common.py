"""What every command shares: the Typer app and its groups, the consoles, fleet.toml and the
registry of this run, and one way to print a table or its JSON."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from fleet.cli import tables
from fleet.core import cards
from fleet.core.config import Config, load
from fleet.core.errors import UsageError
from fleet.core.times import parse_iso
from fleet.providers.base import Provider
from fleet.providers.factory import all_providers
from fleet.state.registry import Registry

if TYPE_CHECKING:
    pass



app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Rent, convert, check and tear down rented GPU boxes.")
sandbox_app = typer.Typer(no_args_is_help=True, help="The local sandbox cloud.")
app.add_typer(sandbox_app, name="sandbox")
release_app = typer.Typer(no_args_is_help=True, help="The release store the fleet publishes.")
app.add_typer(release_app, name="release")
state_app = typer.Typer(no_args_is_help=True, help="The fleet's state database.")
app.add_typer(state_app, name="state")

out = Console()
err = Console(stderr=True)
_state: dict[str, Any] = {}


@app.callback()
def _root(config: Path = typer.Option(None, "--config", "-c", help="fleet.toml to use",
                                      envvar="FLEET_CONFIG")) -> None:
    _state["config_path"] = config


def cfg() -> Config:
    if "config" not in _state:
        _state["config"] = load(_state.get("config_path"))
    c: Config = _state["config"]
    return c


def registry() -> Registry:
    return Registry(cfg().registry)


def providers() -> dict[str, Provider]:
    return dict(all_providers())


def card_option(card: str | None) -> str | None:
    """A --card in any spelling of a known card (`rtx 4090`, RunPod's `NVIDIA GeForce RTX
    4090`) as the fleet's name; an unknown card is a usage error."""
    if card is None:
        return None
    name = cards.canonical(card)
    if name is None:
        raise UsageError(f"unknown card {card!r} (known: {cards.known()})")
    return name


def emit(table: Table, data: Any, as_json: bool) -> None:
    """The data as JSON, or the table as the console's width allows it: whole where it fits,
    folded into one block per row where it does not (`tables.show`)."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
    else:
        tables.show(out, table)


def uptime(created_at: str) -> str:
    try:
        t = parse_iso(created_at)
    except ValueError:
        return "?"
    s = int((datetime.now(UTC) - t).total_seconds())
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class _Stderr(logging.Handler):
    """Each record as one plain line on the standard error of the moment (a test's capture
    replaces it): what the fleet does as it goes. Results and tables stay on `out`."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging never stops a command
            self.handleError(record)


def console_logging() -> None:
    """The `fleet` loggers to the console at INFO, pyinfra's own lines included (a command may
    quiet `fleet.boxes.pyinfra_run`); set afresh for each command run in one process."""
    root = logging.getLogger("fleet")
    root.handlers = [_Stderr()]
    root.setLevel(logging.INFO)
    root.propagate = False
    logging.getLogger("fleet.boxes.pyinfra_run").setLevel(logging.NOTSET)

