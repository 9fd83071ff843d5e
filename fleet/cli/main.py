"""The `fleet` command line (Typer + Rich). Every table also prints as --json.

Importing each command module registers its commands on the one app (`fleet.cli.common`)."""

from __future__ import annotations

import atexit
import gc
import sys

import typer

from fleet.cli import (  # noqa: F401  (imported to register their commands)
    boxes_cmd,
    check_cmd,
    loop_cmd,
    mesh_cmd,
    oneshot_cmd,
    page_cmd,
    publish_cmd,
    sandbox_cmd,
    state_cmd,
    storage_cmd,
)
from fleet.cli.common import app, console_logging, err
from fleet.core.errors import FleetError


def _leave_to_the_os() -> None:
    """At exit, the garbage collector skips what the command made (its modules, their classes
    and functions: all in reference cycles), which the OS takes back whole anyway: tearing
    them down one by one cost a `fleet loop --once` about a tenth of its CPU. Every handler
    registered with `atexit` still runs, and every file the fleet writes is closed (and
    renamed into place) before the command returns."""
    gc.freeze()


def main() -> None:
    atexit.unregister(_leave_to_the_os)  # once, however often main runs (tests run it often)
    atexit.register(_leave_to_the_os)
    console_logging()
    try:
        rc = app(standalone_mode=False)
    except FleetError as e:
        err.print(f"error: {e}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:
        # the command line itself is wrong (unknown command, bad option value): Typer's own
        # usage errors carry format_message()
        fmt = getattr(e, "format_message", None)
        if fmt is None:
            raise
        message = fmt()
        if message:  # empty when the help was shown instead (no command given)
            err.print(f"error: {message}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
