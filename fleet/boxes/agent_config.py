"""agent.toml for a standing box, from its role's settings and its host data.

The programs are the igneum node, miner and prover of the role's release. The node is started
from the pointer (`{node_bin}`), so a later publish switches it without a new agent.toml.
The file's shape is the Jinja2 template templates/agent.toml.j2; every value goes through the
`toml` filter, so a driver string or a path can never break the file. The `{node_bin}`-style
placeholders are the agent's own, filled on the box (they are plain text to Jinja2). The box's
paths and program names come from `agent.contract`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import jinja2

from agent.contract import MINER, NODE, PEERS, PROVER, RELEASES, ROOT, RUN
from fleet.core import cards
from fleet.core.errors import ConfigError

if TYPE_CHECKING:
    from fleet.core.config import Role

NODE_RPC_PORT = 16110

def toml_value(value: Any) -> str:
    """A TOML literal for a string, number, bool or list of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {type(value).__name__}")


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("fleet.boxes", "templates"), autoescape=False,
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["toml"] = toml_value
_TEMPLATE = _ENV.get_template("agent.toml.j2")


def render(role: Role, release_sha16: str, card: str, root: str = ROOT) -> str:
    """The agent.toml text for a box of `card`; refused for a card whose vendor the table
    cannot tell (never taken for NVIDIA), and for a role whose GPU programs have no admitted
    driver for that vendor."""
    vendor = cards.vendor(card)
    if vendor is None:
        raise ConfigError(f"roles.{role.name}: card {card!r}: its vendor cannot be told, so "
                          "neither can the library that would admit its GPU programs")
    role.check_gpu_guard(vendor)
    # An NVIDIA box's file leaves gpu_vendor out (the agent reads none as "nvidia"): the text
    # stays byte for byte what boxes already run, and the deploy restarts an agent whose
    # agent.toml changed
    amd = vendor == cards.AMD
    rel = f"{root}/{RELEASES}/{release_sha16}"
    rpc = f"http://127.0.0.1:{NODE_RPC_PORT}"
    known: dict[str, dict[str, Any]] = {
        NODE: {
            "command": ["{node_bin}", "--datadir", f"{root}/node", "--p2p-port", "{p2p_port}",
                        "--p2p-public", "{p2p_public_ip}:{p2p_public_port}",
                        "--peers-file", f"{root}/{PEERS}", "--rpc-port", str(NODE_RPC_PORT)],
            "status_url": f"{rpc}/status",
            "restart_unhealthy_after_s": role.node_unhealthy_restart_s,
        },
        MINER: {
            "command": [f"{rel}/igneum-miner", "--node-rpc", rpc, "--pack", f"{root}/pack",
                        "--status-file", f"{root}/{RUN}/miner.json"],
            "status_file": f"{root}/{RUN}/miner.json",
        },
        PROVER: {
            "command": [f"{rel}/igneum-prover", "--node-rpc", rpc,
                        "--status-file", f"{root}/{RUN}/prover.json"],
            "status_file": f"{root}/{RUN}/prover.json",
        },
    }
    programs = [
        {"name": name, "needs_gpu": role.needs_gpu(name), "status_url": "", "status_file": "",
         "restart_unhealthy_after_s": None, **known[name]}
        for name in role.programs
    ]
    return _TEMPLATE.render(
        root=root,
        gpu_vendor=vendor if amd else "",
        admitted_driver=(role.admitted_amdgpu if amd else role.admitted_driver) or "",
        admitted_rocm=(role.admitted_rocm or "") if amd else "",
        qualified_gpus=role.qualified_gpus,
        p2p_port=role.p2p_port or 0,
        recipe=[f"{root}/in/box-exec-snapshot.sh", f"{root}/node"],
        pack_command=[f"{rel}/igneum-miner", "export-pack", "--node-rpc", rpc,
                      "--pack", f"{root}/pack"],
        programs=programs,
    )
