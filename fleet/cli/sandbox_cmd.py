"""`fleet sandbox up|down|status|fault`: the local sandbox cloud (see `sandbox_setup`)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import typer

from fleet.core.errors import UsageError

if TYPE_CHECKING:
    pass

from fleet.cli.common import cfg, out, sandbox_app
from fleet.core.paths import sandbox_dir


@sandbox_app.command("up")
def sandbox_up(
    boxes: int = typer.Option(4, min=0, help="boxes to rent, spread over providers"),
    role: str = typer.Option(None, help="role to rent them for (default: first standing)"),
    backend: str = typer.Option("auto", help="ns (real SSH hosts), null or auto"),
    seed: int = typer.Option(7),
    machines: int = typer.Option(16, min=1, help="machines in each provider's market"),
) -> None:
    """Start the fake provider APIs (and boxes), write .sandbox/env, rent BOXES boxes."""
    from fleet.cli import sandbox_setup

    sandbox_setup.up(cfg(), sandbox_dir(), boxes=boxes, role=role, backend=backend, seed=seed,
                   machines=machines, console=out)


@sandbox_app.command("down")
def sandbox_down() -> None:
    """Destroy the sandbox's boxes and stop everything it started."""
    from fleet.cli import sandbox_setup

    sandbox_setup.down(cfg(), sandbox_dir(), console=out)


@sandbox_app.command("status")
def sandbox_status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Is the sandbox up, where, and with what."""
    from fleet.cli import sandbox_setup

    data = sandbox_setup.status(sandbox_dir())
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
    else:
        for k, v in data.items():
            out.print(f"{k}: {v}")


@sandbox_app.command("fault")
def sandbox_fault(kind: str,
                  target: str = typer.Argument("*", help="a box label, provider or call; for "
                                               "store_* faults a repository; * for any"),
                  count: int = typer.Option(1, min=1),
                  driver: str = typer.Option(None, help="driver_drift: the driver NVML reports "
                                             "from then on, e.g. 580.105.08")) -> None:
    """Inject a fault by name (no_capacity, rate_limit, host_death, driver_drift, ...,
    store_upload_refused, store_wrong_bytes, store_ghost_commit, store_busy).

    driver_drift on a provider (`vast`, `runpod`) hits the next box rented there: it arrives
    advertising one driver while NVML reports another, as the operators met it."""
    from fleet.cli import sandbox_setup

    if driver is not None and kind != "driver_drift":
        raise UsageError("--driver goes with driver_drift only")
    res = sandbox_setup.fault(cfg(), sandbox_dir(), kind, target, count,
                            **({"driver": driver} if driver else {}))
    out.print(json.dumps(res))
