"""What a published box must show: the node that runs is the release the registry wants for it,
read from the process itself (`python -m agent readback`), and the pointer names that file."""

from __future__ import annotations

import json
import shlex
from typing import Any

from agent.contract import ROOT


def readback(host: Any) -> dict[str, Any]:
    out = host.check_output(f"cd {ROOT} && venv/bin/python -m agent readback "
                            f"--config {ROOT}/agent.toml")
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def wanted(box: tuple[str, dict[str, Any]]) -> str:
    sha16 = box[1].get("node_sha16_wanted")
    assert sha16, f"{box[0]}: the registry names no wanted node release"
    return str(sha16)


def test_running_node_is_the_wanted_release(host: Any, box: tuple[str, dict[str, Any]]) -> None:
    rb = readback(host)
    node = rb["node"]
    assert node is not None, "no node runs"
    assert node["sha256"][:16] == wanted(box), (
        f"the node process ({node['exe_kind']} {node['path']}) runs {node['sha256'][:16]}, "
        f"the registry wants {wanted(box)}")
    assert node.get("instances", 1) == 1, "more than one node runs"


def test_pointer_target_exists_with_the_wanted_digest(host: Any,
                                                      box: tuple[str, dict[str, Any]]) -> None:
    ptr = readback(host)["pointer"]
    assert ptr is not None, "no pointer"
    target = host.file(ptr["target"])
    assert target.exists and target.mode & 0o111, f"{ptr['target']} missing or not executable"
    digest = host.check_output(f"sha256sum {shlex.quote(ptr['target'])}").split()[0]
    assert digest[:16] == wanted(box) and ptr["sha256"] == digest
