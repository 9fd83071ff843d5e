"""`fleet sandbox ...`: start the local cloud and rent boxes in it through the fleet's own clients.

This module is the only part of `fleet` that knows a sandbox exists. Once `.sandbox/env` is
sourced (it points RUNPOD_API_BASE_URL, VAST_URL and the keys at the fake providers), every other
command and pyinfra itself work unchanged.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import cycle
from pathlib import Path
from typing import Any

from rich.console import Console

from fleet.boxes.sshkeys import ensure_key, public_key
from fleet.core.config import Config
from fleet.core.errors import FleetError, UsageError
from fleet.core.states import BoxKind
from fleet.ops import destroy
from fleet.ops import offers as offers_mod
from fleet.ops import rent as rent_mod
from fleet.providers.factory import all_providers
from fleet.providers.sync import view
from fleet.state import releases
from fleet.state.registry import Registry


def load_env(state_dir: Path) -> dict[str, str]:
    """Point this process at the sandbox, as `set -a; . .sandbox/env` does for a shell."""
    import sandbox.manage as manage

    env = manage.load_env(state_dir)
    os.environ.update(env)
    return env


@contextmanager
def _sandbox_errors() -> Iterator[None]:
    import sandbox.manage as manage

    try:
        yield
    except manage.SandboxError as e:
        raise FleetError(f"sandbox: {e}") from None


def _backend(choice: str) -> str:
    if choice != "auto":
        if choice not in ("ns", "null"):
            raise UsageError(f"unknown backend {choice!r} (ns, null, auto)")
        return choice
    # real SSH hosts need root (namespaces) and Debian's sshd
    has_sshd = bool(shutil.which("sshd")) or Path("/usr/sbin/sshd").exists()
    return "ns" if os.geteuid() == 0 and has_sshd else "null"


def up(cfg: Config, state_dir: Path, boxes: int, role: str | None, backend: str, seed: int,
       console: Console, machines: int = 16) -> list[str]:
    import sandbox.manage as manage
    from sandbox.releases import build_store

    with _sandbox_errors():
        info = manage.up(state_dir, seed=seed, backend=_backend(backend),
                         machines_per_provider=machines)
    # stands in for the release publisher: the simulators' versions, with their digests,
    # recorded through the store's own writer (a release added by hand stays)
    with tempfile.TemporaryDirectory(prefix="fleet-sandbox-releases-") as tmp:
        releases.import_built(cfg.releases, [(r.version, r.path) for r in build_store(Path(tmp))])
    load_env(state_dir)
    from sandbox.control_client import ControlClient

    # stands in for adding the fleet's key to both provider accounts in their consoles
    with ControlClient(info["control_url"]) as control:
        control.add_ssh_key(public_key(ensure_key(cfg.ssh_key)))
    store = f", store {info['hub_url']}" if info.get("hub_url") else ""
    console.print(f"sandbox up: {info.get('runpod_url', '')} {info.get('vast_url', '')}{store} "
                  f"(backend {info.get('backend', backend)}); `set -a; . {state_dir}/env`")
    if boxes == 0:
        return []
    r = cfg.role(role) if role else next(
        (x for x in cfg.roles.values() if x.kind == BoxKind.STANDING), None)
    if r is None:
        raise UsageError("no standing role in fleet.toml; pass --role")
    wants = [w for w in cfg.roster if w.role == r.name] or []
    provs = dict(all_providers())
    plan = cycle([(w.provider, w.card, w.gpus) for w in wants] or
                 [("vast", None, 1), ("runpod", None, 1)])
    labels = []
    for _ in range(boxes):
        prov, card, gpus = next(plan)
        found, failures = offers_mod.search(r, [provs[prov]], card=card, gpus=gpus)
        if failures:
            raise failures[0]
        res = rent_mod.rent(cfg, Registry(cfg.registry), r, found, provs)
        labels.append(res.row.label)
        console.print(f"rented {res.row.label} on {prov} ({res.row.card}, "
                      f"${res.row.usd_per_hour:.3f}/h)")
    if info.get("backend", backend) == "ns":
        rent_mod.wait_ready(cfg, Registry(cfg.registry), provs, labels,
                            progress=lambda label, s: console.print(f"{label}: SSH {s}"))
    return labels


def down(cfg: Config, state_dir: Path, console: Console) -> None:
    import sandbox.manage as manage

    env_file = state_dir / "env"
    if env_file.exists():
        load_env(state_dir)
        reg = Registry(cfg.registry)
        provs = dict(all_providers())
        try:
            v = view(reg, provs)
        except FleetError as e:
            console.print(f"warning: could not list sandbox boxes: {e}")
        else:
            # every box the registry owns, through the one destroy path; the sandbox's other
            # boxes go with its daemon below (it destroys its whole world as it stops)
            for row, box in v.matched:
                try:
                    destroy.destroy(cfg, reg, provs, destroy.Order(
                        row.label, seen_id=box.box_id, force=True))
                except FleetError as e:
                    console.print(f"warning: {row.label}: {e} (its box goes with the sandbox)")
                    continue
                console.print(f"destroyed {row.label}")
    manage.down(state_dir)
    console.print("sandbox down")


def status(state_dir: Path) -> dict[str, Any]:
    import sandbox.manage as manage

    return dict(manage.status(state_dir))


def fault(cfg: Config, state_dir: Path, kind: str, target: str, count: int,
          **params: Any) -> Any:
    import sandbox.manage as manage
    from sandbox.faults import KINDS  # the sandbox's own list: a new kind is known at once
    from sandbox.hub import FAULT_KINDS as STORE_FAULTS  # their TARGET: a repository or `*`

    known = (*sorted(KINDS), *STORE_FAULTS)
    if kind not in known:
        raise UsageError(f"unknown fault {kind!r} (one of: {', '.join(known)})")
    if kind in STORE_FAULTS:
        with _sandbox_errors():
            return manage.fault(state_dir, kind, target, count)
    reg = Registry(cfg.registry)
    row = reg.get(target) if target not in ("runpod", "vast") else None
    # a fleet label names a box; the sandbox knows boxes by provider id
    tgt = row.provider_id if row and row.provider_id else target
    with _sandbox_errors():
        return manage.fault(state_dir, kind, tgt, count, **params)
