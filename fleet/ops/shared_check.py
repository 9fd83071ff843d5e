"""A tick's SSH checks shared between operator machines (`fleet.state.claims`), on PostgreSQL.

The leader posts the tick's boxes and claims batches of them like any other machine, while
standbys claim batches between their polls for the lead (`work`). It waits for every box's
result until `wait_s` has passed (claims that expired open again meanwhile, and it takes them
like any other), then takes over what is still unanswered and checks it itself; a box whose
result does not read is checked again by the leader too. So a fleet of one machine checks as
before, and a machine killed holding a claim costs time, never a check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleet.boxes.inventory import Built
from fleet.boxes.sshkeys import write_known_hosts
from fleet.core.verdicts import Health
from fleet.state import claims
from fleet.state.db import Database
from fleet.state.registry import Registry

if TYPE_CHECKING:
    from fleet.core.config import Config
    from fleet.state.leader import Fence

Check = Callable[["Config", Built], list[Health]]
POLL_S = 0.2  # the leader looks for results this often


def _run(db: Database, cfg: Config, c: claims.Claim, check_fn: Check) -> list[Health]:
    """Check a claim's boxes with this machine's key and known hosts; store the results:
    those stored (its token still held them)."""
    hosts = [(label, {**data, "ssh_key": str(cfg.ssh_key),
                      "ssh_known_hosts_file": str(cfg.known_hosts)}) for label, data in c.hosts]
    return claims.store(db, c, check_fn(cfg, Built(groups={"standing": hosts})))


def work(cfg: Config, check_fn: Check, limit: int = claims.BATCH,
         claim_s: float = claims.CLAIM_S) -> int:
    """A standby's share: claim one batch of the open checks, check it, store the results;
    how many were stored (0: none was open)."""
    reg = Registry(cfg.registry)
    c = claims.claim(reg.db, limit, claim_s)
    if c is None:
        return 0
    write_known_hosts(cfg.known_hosts, reg.rows())  # the host keys the leader pinned
    return len(_run(reg.db, cfg, c, check_fn))


def lead(db: Database, cfg: Config, tick: int, hosts: list[tuple[str, dict[str, Any]]],
         check_fn: Check, wait_s: float, limit: int = claims.BATCH,
         claim_s: float = claims.CLAIM_S, fence: Fence | None = None) -> list[Health]:
    """Tick `tick`'s checks of `hosts`, shared: every box's verdict, in `hosts`' order (posted
    only while `fence` leads)."""
    claims.post(db, tick, hosts, fence)
    mine: dict[str, Health] = {}  # its own verdicts, as they are: not read back
    deadline = time.monotonic() + wait_s
    while claims.unanswered(db, tick):
        c = claims.claim(db, limit, claim_s)
        if c is not None:
            mine |= {h.label: h for h in _run(db, cfg, c, check_fn)}
        elif time.monotonic() >= deadline:
            break
        else:
            time.sleep(POLL_S)
    rest = claims.take_over(db, tick, claim_s)
    if rest is not None:
        mine |= {h.label: h for h in _run(db, cfg, rest, check_fn)}
    got = claims.results(db, tick) | mine
    unread = [(label, data) for label, data in hosts if label not in got]
    if unread:  # another machine's result that does not read: never a verdict of its own
        got |= {h.label: h for h in check_fn(cfg, Built(groups={"standing": unread}))}
    return [got[label] for label, _ in hosts if label in got]
