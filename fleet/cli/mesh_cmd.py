"""`fleet mesh`: who dials whom among the standing boxes, as their nodes report it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from fleet.cli import common, tables
from fleet.cli.common import app, cfg, out, registry
from fleet.core.verdicts import mesh_summary

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config
    from fleet.core.verdicts import Health

PEER_COLUMNS = ("dir", "remote", "box")


@app.command("mesh")
def mesh_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """Each standing box's inbound and outbound peers, with the box behind each remote
    endpoint (the fleet's boxes by their public p2p mapping), one table per box, grouped by
    network with one summary line each; a node dialled by fewer of its network's peers than
    the mesh needs is flagged star-only."""
    import json
    import sys

    from fleet.boxes.inventory import build
    from fleet.ops import check as check_mod

    c = cfg()
    results = check_mod.check(c, build(c, common.providers()))
    data = mesh_data(results, registry().rows(), c)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
        return
    for name, line in zip(data["networks"], summary_lines(data), strict=True):
        for box in data["boxes"]:
            if box["network"] == name:
                tables.show(out, peer_table(box))
        out.print(line, soft_wrap=True, highlight=False, markup=False)


def endpoints(rows: Sequence[Row]) -> dict[str, str]:
    """`ip:port` of each live box's public p2p mapping -> its label."""
    return {f"{r.public_ip}:{r.p2p_public_port}": r.label for r in rows
            if r.live and r.public_ip and r.p2p_public_port}


def mesh_data(results: Sequence[Health], rows: Sequence[Row], cfg: Config) -> dict[str, Any]:
    """The mesh as the nodes report it: per box its network, counts and peers (each remote
    named by the box it is, where it is one of the fleet's), and the degree distribution (how
    many nodes have each inbound count; unknown counts apart), over all boxes and per network
    (sorted by name, with its roles)."""
    by_endpoint = endpoints(rows)
    role_of = {r.label: r.role for r in rows}
    network = [cfg.network_of(role_of.get(h.label, "?")) for h in results]
    boxes: list[dict[str, Any]] = []
    for h, net in zip(results, network, strict=True):
        peers = [{"dir": _text(p.get("dir")), "remote": _text(p.get("remote")),
                  "box": by_endpoint.get(str(p.get("remote")))} for p in h.peer_list]
        boxes.append({"label": h.label, "network": net,
                      "peers_in": h.peers_in, "peers_out": h.peers_out,
                      "star_only": h.star_only, "port_owed": h.port_owed, "peers": peers,
                      "cell": h.peers_word()})
    networks = {}
    for name in sorted(set(network)):
        mine = [h for h, net in zip(results, network, strict=True) if net == name]
        networks[name] = {"roles": list(cfg.network_roles(name)), **_summary(mine)}
    return {"boxes": boxes, **_summary(results), "networks": networks}


def _text(v: Any) -> str | None:
    """A peer's field as text; None where the node did not say (`?` in the table)."""
    return None if v is None else str(v)


def _summary(results: Sequence[Health]) -> dict[str, Any]:
    return {**mesh_summary([(h.label, h.peers_in, h.star_only) for h in results]),
            "owed_port": {h.label: h.port_owed for h in results if h.port_owed}}


def peer_table(box: Mapping[str, Any]) -> Table:
    rows = [{"dir": p["dir"], "remote": p["remote"], "box": p["box"] or "-"}
            for p in box["peers"]]
    return tables.build(f"{box['label']}: in/out {box['cell']}", PEER_COLUMNS, rows,
                        caption=None if rows else "no peers reported")


def summary_lines(data: Mapping[str, Any]) -> list[str]:
    """One line per network: its name (and its roles, where it groups others than its
    own) and its mesh's summary."""
    lines = []
    for name, net in data["networks"].items():
        roles = "" if net["roles"] == [name] else f" ({', '.join(net['roles'])})"
        lines.append(f"network {name}{roles}: {summary_line(net)}")
    return lines


def summary_line(data: Mapping[str, Any]) -> str:
    degrees = ", ".join(f"{n} with {k} in" for k, n in data["in_degrees"].items()) or "none"
    star = ", ".join(data["star_only"]) or "none"
    owed = "; ".join(f"{k} ({why})" for k, why in data["owed_port"].items()) or "none"
    return (f"{data['dialable']} of {data['known']} nodes dialled by a peer; in-degrees: "
            f"{degrees}; star-only: {star}; owed a port: {owed}")
