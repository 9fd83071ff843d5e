"""The loop's test bench: an in-memory Vast (`FakeVast`), a Loop over it with given check
verdicts (`make`), and a converted standing box on it (`standing_box`), for every test of the
loop's decisions in this folder."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from fleet.cli.loop_cmd import page_after_tick
from fleet.core import config
from fleet.core.boxes import Row
from fleet.core.errors import ProviderError
from fleet.core.verdicts import Health
from fleet.ops.loop import Loop
from fleet.providers.base import Box, Offer, RentRequest

TOML = """
[fleet]
registry = "{tmp}/state/boxes.json"
ssh_key = "{tmp}/state/ssh/fleet"
daily_budget_usd = {budget}
[loop]
orphan_grace_s = {grace}
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
admitted_driver = "580.95.05"
[[roster.live]]
provider = "vast"
card = "RTX 4090"
"""


class FakeVast:
    name = "vast"

    def __init__(self) -> None:
        self.listed: dict[str, Box] = {}
        self.market: list[Offer] = []
        self.failing = False
        self.destroyed: list[str] = []
        self.odd: dict[str, Any] = {}  # box id -> the Unreadable its listing row reads as

    def offers(self, card: str | None = None, gpu_count: int = 1, driver: str | None = None,
               direct_ports: int = 0, cuda: tuple[str, ...] = (),
               rocm: tuple[str, ...] = (),
               disk_gb: float | None = None) -> list[Offer]:
        return [o for o in self.market if card in (None, o.card)]

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        raise AssertionError("these tests never get as far as a rent")

    def boxes(self) -> list[Any]:
        if self.failing:
            raise ProviderError("vast", "list", "HTTP 503")
        return list(self.listed.values()) + list(self.odd.values())

    def box(self, box_id: str) -> Box | None:
        if box_id in self.odd:  # as the clients do: an odd row is never "no such box"
            raise ProviderError("vast", "show", f"box {box_id} is unreadable")
        return self.listed.get(box_id)

    def find_by_label(self, label: str) -> Box | None:
        if any(u.label == label for u in self.odd.values()):
            raise ProviderError("vast", "list", f"a box labelled {label} is unreadable")
        return next((b for b in self.listed.values() if b.label == label), None)

    def stop(self, box_id: str) -> None:
        raise AssertionError("the loop never stops boxes")

    def destroy(self, box_id: str) -> None:
        self.destroyed.append(box_id)
        self.listed.pop(box_id, None)


def make(tmp_path: Path, budget: float = 100, grace: float = 600) -> tuple[Loop, FakeVast,
                                                                           list[bool]]:
    cfg = config.parse(tomllib.loads(TOML.format(tmp=tmp_path, budget=budget, grace=grace)),
                       tmp_path / "fleet.toml")
    vast = FakeVast()
    cfg.ssh_key.parent.mkdir(parents=True)
    cfg.ssh_key.write_text("a key\n")  # the loop checks nothing with a key it cannot read
    cfg.ssh_key.with_suffix(".pub").write_text("ssh-ed25519 AAAA fleet\n")
    ssh_answers: list[bool] = []  # what the next checks see: SSH answers or not

    def check(_cfg: Any, built: Any) -> list[Health]:
        up = ssh_answers.pop(0) if ssh_answers else True
        return [Health(label, "vast", ssh=up, agent=up) for label, _ in
                built.groups["standing"]]

    def converge(_cfg: Any, labels: list[str]) -> None:
        raise AssertionError(f"nothing to converge here: {labels}")

    loop = Loop(cfg, {"vast": vast}, after_tick=page_after_tick(cfg, tmp_path / "page"),
                echo=lambda _: None, converge_fn=converge, check_fn=check)
    return loop, vast, ssh_answers


def standing_box(loop: Loop, vast: FakeVast, label: str = "live-vast-aaaaaa",
                 box_id: str = "1") -> Row:
    row = Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
              gpu_count=1, usd_per_hour=0.3, status="running", provider_id=box_id,
              host_key="ssh-ed25519 AAAA", ssh_host="10.0.0.1", ssh_port=22, standing=True)
    loop.reg.add(row)
    vast.listed[box_id] = Box("vast", box_id, label, "RTX 4090", 1, 0.3, "running",
                              ssh_host="10.0.0.1", ssh_port=22)
    return row
