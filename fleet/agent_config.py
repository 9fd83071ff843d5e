"""agent.toml for a standing box, from its role's settings and its host data.

The programs are the igneum node, miner and prover of the role's release. The node is started
from the pointer (`{node_bin}`), so a later publish switches it without a new agent.toml.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from fleet.config import Role

ROOT = "/root/fleet"
NODE_RPC_PORT = 16110


def _q(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _argv(args: Sequence[str]) -> str:
    return "[" + ", ".join(_q(a) for a in args) + "]"


def render(role: Role, release_sha16: str, root: str = ROOT) -> str:
    rel = f"{root}/releases/{release_sha16}"
    rpc = f"http://127.0.0.1:{NODE_RPC_PORT}"
    lines = [
        "# written by fleet's standing deploy; edits are overwritten",
        f"root = {_q(root)}",
        f"admitted_driver = {_q(role.admitted_driver or '')}",
        f"qualified_gpus = {_argv(role.qualified_gpus)}",
        f"p2p_port = {role.p2p_port or 0}",
        "",
        "[recovery]",
        f"recipe = {_argv([f'{root}/in/box-exec-snapshot.sh', f'{root}/node'])}",
        "min_blocks = 1000",
        "cooldown_s = 1800",
        "",
        "[miner_pack]",
        f"command = {_argv([f'{rel}/igneum-miner', 'export-pack', '--node-rpc', rpc, '--pack', f'{root}/pack'])}",  # noqa: E501
    ]
    programs = {
        "node": (
            ["{node_bin}", "--datadir", f"{root}/node", "--p2p-port", "{p2p_port}",
             "--p2p-public", "{p2p_public_ip}:{p2p_public_port}",
             "--peers-file", f"{root}/peers.txt", "--rpc-port", str(NODE_RPC_PORT)],
            [f"status_url = {_q(rpc + '/status')}"],
        ),
        "miner": (
            [f"{rel}/igneum-miner", "--node-rpc", rpc, "--pack", f"{root}/pack",
             "--status-file", f"{root}/run/miner.json"],
            ["needs_gpu = true", f"status_file = {_q(f'{root}/run/miner.json')}"],
        ),
        "prover": (
            [f"{rel}/igneum-prover", "--node-rpc", rpc, "--status-file", f"{root}/run/prover.json"],
            [f"status_file = {_q(f'{root}/run/prover.json')}"],
        ),
    }
    for name in role.programs:
        argv, extra = programs[name]
        lines += ["", f"[programs.{name}]", f"command = {_argv(argv)}", *extra]
    return "\n".join(lines) + "\n"
