"""Owed ports: a standing box of a p2p role that the other nodes cannot dial.

A role with a `p2p_port` wants a mesh: every node dialled by its mates (the other standing boxes
of its network, whatever their role) through its provider's public mapping of that port. A box
is *owed a port*, once it has stood one loop interval, when

- its provider has never listed a public mapping of the port (a Vast host with too few direct
  ports, an offer rented when none mapped one): nothing can dial it; or
- its mapping is measured undialable: none of its mates dials it, while some of them dial
  others (the mesh works, this box's mapping does not). The loop acts on this only once the
  mates' peers files have held the mapping for SETTLE_S (`Loop._start_moves`).

The loop then rents a replacement from an offer that maps one, within the budget, and destroys
the old box only once the new node is checked well, synced and dialled (`Loop._finish_moves`);
while no offer maps one, the box stays and the loop says why on every tick.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleet.core.config import host_network
from fleet.core.times import now_iso, seconds_between

if TYPE_CHECKING:
    from fleet.core.config import Role
    from fleet.core.verdicts import Health
    from fleet.providers.base import Offer


# how long the peers files must have held a mapping before no mate dialling it is the
# mapping's fault: a node's reading may be three agent ticks old (`check.STALE_TICKS`, 15 s
# each) and dialling takes a few seconds more
SETTLE_S = 60.0


def direct(role: Role) -> int:
    """Direct ports an offer needs for its box to map the role's p2p port: on Vast the direct
    SSH takes one of the host's direct ports too, and a host with fewer than asked maps none
    (shared/research/providers.md: "direct_port_count too small means no ports entries").
    0 for a role without a p2p port."""
    return len(role.tcp_ports) if role.p2p_port else 0


def rent_note(role: Role, offer: Offer) -> str | None:
    """What the row of a box rented from a portless offer (`offers.search`) says."""
    if not offer.portless:
        return None
    return (f"owed a port: no offer mapped the p2p port {role.p2p_port} when it was rented; "
            "the loop replaces it once one does")


def owed(data: Mapping[str, Any], h: Health, mates: Collection[Health],
         stood: bool) -> str | None:
    """Why the box of host data `data`, checked as `h`, is owed a port; None when it is not
    (or its role has no p2p port, or it has not `stood` one loop interval since its
    conversion: a mapping may be listed late). `mates`: the checks of the other standing
    boxes of its network, this tick."""
    port = data.get("p2p_port")
    if not port or not stood:
        return None
    ip, public = data.get("public_ip"), data.get("p2p_public_port")
    if not ip or not public:
        return f"no mapped p2p port: {data.get('provider')} lists no public mapping of port {port}"
    if h.star_only and h.peers_in == 0:
        # evidence only from mates that do dial out: a mate that dials no one says nothing
        dialling = sum(1 for m in mates if (m.peers_out or 0) > 0)
        if dialling:
            return (f"its mapping {ip}:{public} is dialled by none of its {len(mates)} mates, "
                    f"while {dialling} of them dial others")
    return None


def judge(hosts: Sequence[tuple[str, Mapping[str, Any]]], checks: Sequence[Health],
          interval_s: float) -> None:
    """Set `port_owed` on each check of `hosts` (name, host data; one check each, in order)
    whose box answered: its mates are the other boxes of its network checked with it."""
    now = now_iso()
    networks: dict[str, list[Health]] = {}
    for (_, data), h in zip(hosts, checks, strict=True):
        networks.setdefault(host_network(data), []).append(h)
    for (_, data), h in zip(hosts, checks, strict=True):
        since = data.get("standing_since")
        stood = seconds_between(since, now) if since else None
        h.port_owed = owed(data, h, _Mates(networks[host_network(data)], h),
                           stood is not None and stood >= interval_s) if h.ssh else None


class _Mates:
    """The checks of a box's mates, the others of its network (`network`: all of the
    network's), gone through only where the rule reads them: a box its mates dial never lists
    them, so judging a healthy mesh is not quadratic in its size."""

    def __init__(self, network: list[Health], h: Health) -> None:
        self.network, self.h = network, h

    def __len__(self) -> int:
        return len(self.network) - 1

    def __iter__(self) -> Iterator[Health]:
        return (m for m in self.network if m is not self.h)

    def __contains__(self, m: object) -> bool:
        return m is not self.h and m in self.network
