"""testinfra over the fleet's own inventory: every standing box (and every one-shot box, for
the one-shot checks), through its pinned host key.

Run after a deploy, against the sandbox or real providers alike:

    pytest tests/infra                      # uses inventory.py (FLEET_INVENTORY to override)

The inventory is the same file pyinfra reads (loaded without pyinfra's CLI, so no gevent
patching); each box is reached with the fleet's key, and the key it presents must be the one
pinned in the registry.
"""

from __future__ import annotations

import json
import os
import runpy
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import testinfra

from agent.contract import ROOT
from fleet.boxes.sshkeys import fetch_host_key

REPO = Path(__file__).resolve().parents[2]


def _groups() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """The inventory's boxes by kind; FLEET_INFRA_LIMIT (labels, comma-separated) narrows them
    to the boxes a deploy just touched (the loop checks the boxes it converted)."""
    path = os.environ.get("FLEET_INVENTORY", str(REPO / "inventory.py"))
    ns = runpy.run_path(path)
    only = {x for x in os.environ.get("FLEET_INFRA_LIMIT", "").split(",") if x}
    return {kind: [h for h in ns.get(kind, []) if not only or h[0] in only]
            for kind in ("standing", "oneshot")}


GROUPS = _groups()
HOSTS = GROUPS["standing"]
ONESHOT = GROUPS["oneshot"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The checks of a kind of box the inventory lacks are left out (not skipped); an
    inventory with nothing to check at all is an error, never a green run."""
    absent = [f for f, hosts in (("box", HOSTS), ("oneshot_box", ONESHOT)) if not hosts]
    keep, drop = [], []
    for item in items:
        uses = getattr(item, "fixturenames", ())
        (drop if any(f in uses for f in absent) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if not keep:
        raise pytest.UsageError("tests/infra: the inventory has no boxes to check")


@pytest.fixture(scope="module", params=HOSTS, ids=[name for name, _ in HOSTS])
def box(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=ONESHOT, ids=[name for name, _ in ONESHOT])
def oneshot_box(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param  # type: ignore[no-any-return]


def _pinned_key(data: dict[str, Any]) -> str | None:
    kh = Path(data["ssh_known_hosts_file"])
    host, port = data["ssh_hostname"], int(data["ssh_port"])
    name = host if port == 22 else f"[{host}]:{port}"
    for line in kh.read_text().splitlines() if kh.exists() else []:
        parts = line.split()
        if len(parts) >= 3 and parts[0] == name:
            return f"{parts[1]} {parts[2]}"
    return None


@pytest.fixture(scope="module")
def host(box: tuple[str, dict[str, Any]]) -> Any:
    """testinfra's `host`, for this standing box, settled (see `_settle`)."""
    h = _connect(*box)
    _settle(h)
    return h


@pytest.fixture(scope="module")
def oneshot_host(oneshot_box: tuple[str, dict[str, Any]]) -> Any:
    """testinfra's `host`, for this one-shot box."""
    return _connect(*oneshot_box)


def _connect(name: str, data: dict[str, Any]) -> Any:
    """A testinfra host for the box, refusing a host key other than the pinned one."""
    pinned = _pinned_key(data)
    assert pinned is not None, f"{name}: no pinned host key in {data['ssh_known_hosts_file']}"
    # compare before running anything on the box: a box presenting another key is not ours
    presented = fetch_host_key(data["ssh_hostname"], int(data["ssh_port"]))
    assert presented == pinned, f"{name}: host key differs from the pinned one"
    spec = (f"paramiko://root@{data['ssh_hostname']}:{data['ssh_port']}"
            f"?ssh_identity_file={quote(data['ssh_key'])}&timeout=30")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # paramiko backend warns about unknown host keys
        h = testinfra.get_host(spec)
        h.run("true")
    key = h.backend.client.get_transport().get_remote_server_key()
    assert f"{key.get_name()} {key.get_base64()}" == pinned, f"{name}: host key changed"
    return h


SETTLE_S = float(os.environ.get("FLEET_INFRA_SETTLE_S", "90"))


def _settle(host: Any) -> None:
    """Right after a deploy the agent may not have probed its node or written its first RESULT
    line yet (it reports every tick): wait, bounded, for the box to report, then check it."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        r = host.run(f"cd {ROOT} && venv/bin/python -m agent status --config agent.toml")
        status = json.loads(r.stdout) if r.rc == 0 and r.stdout.strip() else {}
        logged = host.run(f"grep -q '^RESULT standing' {ROOT}/out/standing.log").rc == 0
        if status.get("alive") and (status.get("node") or {}).get("rpc") and logged:
            return
        if time.monotonic() > deadline:
            return  # the checks then say what is missing
        time.sleep(1)
