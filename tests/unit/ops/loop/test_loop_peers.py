"""The loop keeps every standing box's peers file current: the peers deploy runs when a role's
set of public p2p endpoints changes (a box rented or gone, a mapping changed on a restart),
never when it did not, and a failure is tried again next tick. The sandbox tests run the real
deploy on real boxes (tests/integration/test_mesh_sandbox.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from loop_fixture import FakeVast

from fleet.core import config
from fleet.core.boxes import Row
from fleet.core.verdicts import Health
from fleet.ops.loop import Loop
from fleet.providers.base import Box

TOML = """
[fleet]
registry = "{tmp}/state/boxes.json"
ssh_key = "{tmp}/state/ssh/fleet"
daily_budget_usd = 100
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
admitted_driver = "580.95.05"
p2p_port = 26611
[roles.other]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
admitted_driver = "580.95.05"
"""


def make(tmp_path: Path) -> tuple[Loop, FakeVast, list[list[str]], list[str | None]]:
    cfg = config.parse(tomllib.loads(TOML.format(tmp=tmp_path)), tmp_path / "fleet.toml")
    cfg.ssh_key.parent.mkdir(parents=True)
    cfg.ssh_key.write_text("a key\n")
    vast = FakeVast()
    written: list[list[str]] = []
    answers: list[str | None] = []  # what the next peers deploys answer (None: passed)

    def peers(_cfg: Any, labels: list[str]) -> str | None:
        written.append(labels)
        return answers.pop(0) if answers else None

    def check(_cfg: Any, built: Any) -> list[Health]:
        return [Health(label, "vast", ssh=True, agent=True) for label, _ in
                built.groups["standing"]]

    lp = Loop(cfg, {"vast": vast}, echo=lambda _: None, check_fn=check, peers_fn=peers,
              converge_fn=lambda _c, labels: None)
    return lp, vast, written, answers


def box(lp: Loop, vast: FakeVast, n: int, port: int, role: str = "live") -> Row:
    label = f"{role}-vast-{n:06d}"
    row = Row(label=label, provider="vast", role=role, kind="standing", card="RTX 4090",
              gpu_count=1, usd_per_hour=0.3, status="running", provider_id=str(n),
              host_key="ssh-ed25519 AAAA", ssh_host="10.0.0.1", ssh_port=22, standing=True,
              public_ip=f"10.77.1.{n}", p2p_public_port=port)
    lp.reg.add(row)
    vast.listed[str(n)] = Box("vast", str(n), label, "RTX 4090", 1, 0.3, "running",
                              ssh_host="10.0.0.1", ssh_port=22, public_ip=f"10.77.1.{n}",
                              p2p_public_port=port)
    return row


def test_the_peers_files_are_written_when_the_set_changes_and_only_then(tmp_path: Path) -> None:
    lp, vast, written, _ = make(tmp_path)
    a, b = box(lp, vast, 1, 40001), box(lp, vast, 2, 40002)
    box(lp, vast, 3, 0, role="other")  # a role without a p2p port: no peers file
    t = lp.tick()
    assert written == [[a.label, b.label]]
    assert "peers files of role live rewritten on 2 boxes (2 dialable endpoints)" in t.actions
    assert lp.tick().actions == [] and len(written) == 1  # nothing changed: nothing written
    c = box(lp, vast, 4, 40004)
    lp.tick()
    assert written[-1] == [a.label, b.label, c.label]
    # a restart maps the p2p port anew: the registry and every peers file follow
    vast.listed["2"].p2p_public_port = 41002
    lp.tick()
    assert lp.reg.get(b.label).p2p_public_port == 41002  # type: ignore[union-attr]
    assert written[-1] == [a.label, b.label, c.label] and len(written) == 3


def test_a_failed_peers_deploy_is_tried_again_next_tick(tmp_path: Path) -> None:
    lp, vast, written, answers = make(tmp_path)
    box(lp, vast, 1, 40001), box(lp, vast, 2, 40002)
    answers.append("the peers deploy failed: SSH did not answer")
    t = lp.tick()
    assert any("tried again next tick" in a for a in t.actions)
    lp.tick()
    assert len(written) == 2  # tried again, and passed
    lp.tick()
    assert len(written) == 2


def test_a_peers_file_names_the_other_boxes_of_its_role_that_have_a_mapping() -> None:
    from fleet.boxes.deploy_support import peers_text

    hosts: list[tuple[str, dict[str, object]]] = [
        ("a", {"role": "live", "public_ip": "10.77.1.1", "p2p_public_port": 40001}),
        ("b", {"role": "live", "public_ip": "10.77.1.2", "p2p_public_port": 40002}),
        ("c", {"role": "live", "public_ip": "10.77.1.3", "p2p_public_port": None}),
        ("d", {"role": "other", "public_ip": "10.77.1.4", "p2p_public_port": 40004}),
    ]
    assert peers_text("a", hosts) == "10.77.1.2:40002\n"
    assert peers_text("c", hosts) == "10.77.1.1:40001\n10.77.1.2:40002\n"
    assert peers_text("d", hosts) == ""
