"""Build pyinfra's inventory from the registry and the providers' live listings.

Host name = the box's label. Groups: one per role, one per kind (`standing`, `oneshot`) and one
per provider. Only boxes that are both listed live by a provider and known to the registry are
deployed to; the rest are orphans, reported and never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.boxes.sshkeys import write_known_hosts
from fleet.core.errors import FleetError
from fleet.providers.sync import view
from fleet.state.registry import Registry

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config
    from fleet.providers.base import Box, Provider

Hosts = list[tuple[str, dict[str, Any]]]


@dataclass
class Built:
    groups: dict[str, Hosts] = field(default_factory=dict)
    orphans: list[Box] = field(default_factory=list)
    # registry boxes no deploy can reach: (row, what the provider says: a status, or "gone")
    down: list[tuple[Row, str]] = field(default_factory=list)


def host_data(cfg: Config, row: Row, box: Box) -> dict[str, Any]:
    role = cfg.roles.get(row.role)
    public_ip, p2p_public_port = box.p2p_endpoint((row.public_ip, row.p2p_public_port))
    data: dict[str, Any] = {
        "ssh_hostname": box.ssh_host or row.ssh_host,
        "ssh_port": box.ssh_port or row.ssh_port,
        "ssh_user": "root",
        "ssh_key": str(cfg.ssh_key),
        "ssh_known_hosts_file": str(cfg.known_hosts),
        # the key was pinned at rent time; a box presenting another one is refused
        "ssh_strict_host_key_checking": "yes" if row.host_key else "accept-new",
        "host_key": row.host_key,  # names the box's master connection (`boxssh`, `sshmux`)
        "ssh_connect_retries": 2,
        "provider": row.provider,
        "provider_id": row.provider_id,
        "card": row.card,
        "gpu_count": row.gpu_count,
        "usd_per_hour": row.usd_per_hour,
        "role": row.role,
        # the mesh its node joins: the network's other standing boxes fill its peers file
        "network": cfg.network_of(row.role),
        "kind": row.kind,
        "standing": row.standing,
        "standing_since": row.standing_since,
        "public_ip": public_ip,
        "p2p_public_port": p2p_public_port,
        "node_sha16_wanted": row.node_sha16_wanted,
        "job_name": row.job,  # a one-shot box's job (the job *file* comes as --data job=...)
        "job_outputs": row.outputs,  # and the outputs folder its teardown reads back
    }
    if role is not None:
        data.update({
            "p2p_port": role.p2p_port,
            "programs": list(role.programs),  # its duties, which its check judges
            "gpu_programs": list(role.gpu_programs),
            "admitted_driver": role.admitted_driver,
            "qualified_gpus": list(role.qualified_gpus),
            "release": role.release,
            "image": role.image,
        })
    return data


def build(cfg: Config, providers: Mapping[str, Provider]) -> Built:
    reg = Registry(cfg.registry)
    v = view(reg, providers)
    if v.failures:
        raise FleetError("; ".join(str(f) for f in v.failures))
    built = Built(orphans=v.orphans, down=[(r, "gone") for r in v.gone])
    for row, box in sorted(v.matched, key=lambda rb: rb[0].label):
        if box.status != "running" or not (box.ssh_host or row.ssh_host):
            built.down.append((row, box.status))
            continue
        entry = (row.label, host_data(cfg, row, box))
        for g in (row.role, row.kind, row.provider):
            built.groups.setdefault(g, []).append(entry)
    write_known_hosts(cfg.known_hosts, reg.rows())
    return built
