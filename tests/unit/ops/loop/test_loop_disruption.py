"""The disruption budget: a role loses at most max(1, 25 % of its wanted boxes) an hour to the
loop's own judgement (dead by SSH, unfit, swept, moved); a box its provider reports down is
never held, and counts all the same (the fake provider of loop_fixture.py)."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
from loop_fixture import TOML, FakeVast, make, standing_box

from fleet.core import config
from fleet.core.boxes import Row
from fleet.core.config import Want
from fleet.core.errors import ConfigError, ProviderError
from fleet.core.verdicts import Health
from fleet.ops import loop as loop_mod
from fleet.state.loop_memory import Memory


def fleet_of(tmp_path: Path, wanted: int, quiet: set[str]) -> tuple[loop_mod.Loop, FakeVast]:
    """A role wanting `wanted` boxes, all standing; the boxes with ids in `quiet` fail SSH."""
    loop, vast, _ = make(tmp_path)
    loop.cfg = dataclasses.replace(loop.cfg, roster=(Want("live", "vast", "RTX 4090", 1,
                                                           wanted),))
    for n in range(1, wanted + 1):
        standing_box(loop, vast, f"live-vast-{n:06x}", box_id=str(n))

    def check(_cfg: Any, built: Any) -> list[Health]:
        return [Health(label, "vast", ssh=d["provider_id"] not in quiet,
                       agent=d["provider_id"] not in quiet)
                for label, d in built.groups["standing"]]

    loop.check_fn = check
    return loop, vast


def an_hour_passes(loop: loop_mod.Loop) -> None:
    mem = Memory.load(loop.cfg.registry)
    for r in mem.disruptions:
        r["at_epoch"] -= 3600
    mem.save(loop.cfg.registry)


def test_two_boxes_dead_by_ssh_at_once_lose_one_and_keep_the_other_until_the_hour_allows(
        tmp_path: Path) -> None:
    loop, vast = fleet_of(tmp_path, 4, quiet={"1", "2"})  # 2 of 4: no breaker trips
    loop.tick()
    t = loop.tick()  # both dead on their second check
    assert vast.destroyed == ["1"]  # one, not both
    kept = [a for a in t.actions if "disruption budget spent" in a]
    assert kept == ["live-vast-000002: disruption budget spent: 1 destroyed in the last hour "
                    "(role live may lose 1 of 4); live-vast-000002 kept (SSH does not answer "
                    "while its provider says running; `fleet destroy live-vast-000002` still "
                    "works)"], t.actions
    t = loop.tick()  # said on every tick, and still kept
    assert vast.destroyed == ["1"] and any("disruption budget spent" in a for a in t.actions)
    assert loop.reg.get("live-vast-000002").live  # type: ignore[union-attr]
    an_hour_passes(loop)
    loop.tick()
    assert vast.destroyed == ["1", "2"]


def test_boxes_their_provider_reports_exited_are_replaced_at_once_and_count(
        tmp_path: Path) -> None:
    loop, vast = fleet_of(tmp_path, 8, quiet={"4"})  # 8 wanted: 2 an hour
    for n in ("1", "2", "3"):
        vast.listed[n] = dataclasses.replace(vast.listed[n], status="exited")
    loop.tick()
    t = loop.tick()
    assert sorted(vast.destroyed) == ["1", "2", "3"], t.actions  # nothing alive was lost
    assert loop.reg.get("live-vast-000004").live  # type: ignore[union-attr]
    assert any("live-vast-000004: disruption budget spent: 3 destroyed in the last hour "
               "(role live may lose 2 of 8)" in a for a in t.actions), t.actions


def test_swept_orphans_spend_the_budget_too(tmp_path: Path) -> None:
    loop, vast = fleet_of(tmp_path, 4, quiet=set())
    fid = loop.reg.fleet_id()
    for n in (7, 8):  # rents given up whose boxes landed after all
        label = f"live-{fid}-vast-0b0b0{n}"
        loop.reg.add(Row(label=label, provider="vast", role="live", kind="standing",
                         card="RTX 4090", gpu_count=1, usd_per_hour=0.3))
        loop.reg.mark_destroyed(label, "vanished")
        vast.listed[str(n)] = dataclasses.replace(vast.listed["1"], box_id=str(n), label=label)
    loop.tick()
    mem = Memory.load(loop.cfg.registry)
    mem.orphans = {k: "2000-01-01T00:00:00Z" for k in mem.orphans}
    mem.save(loop.cfg.registry)
    t = loop.tick()
    assert vast.destroyed == ["7"], t.actions
    assert any(f"orphan live-{fid}-vast-0b0b08 (vast/8): disruption budget spent" in a
               for a in t.actions), t.actions


def test_the_budget_is_saved_before_the_destroy_and_kept_when_the_destroy_fails(
        tmp_path: Path) -> None:
    """A terminate the provider took whose answer was lost, or whose box lingers in the
    listing, raises; the spend stays (before: given back, and every other dead box of the
    role went in the same tick). Trying the same box again spends nothing more."""
    loop, vast = fleet_of(tmp_path, 4, quiet={"1", "2"})  # 2 of 4: no breaker; 1 an hour
    seen: list[list[Any]] = []
    terminated: list[str] = []

    def destroy(box_id: str) -> None:  # what a loop killed during the destroy leaves
        seen.append(Memory.load(loop.cfg.registry).disruptions)
        terminated.append(box_id)
        raise ProviderError("vast", "destroy", f"box {box_id} is still listed 120 s after")

    vast.destroy = destroy  # type: ignore[method-assign]
    loop.tick()
    t = loop.tick()
    assert terminated == ["1"], t.actions
    assert [[r["label"] for r in s] for s in seen] == [["live-vast-000001"]]
    assert any("live-vast-000002: disruption budget spent" in a for a in t.actions), t.actions
    del vast.destroy  # the real one again: the listing catches up
    loop.tick()
    assert vast.destroyed == ["1"]
    spent = Memory.load(loop.cfg.registry).disruptions
    assert [r["label"] for r in spent] == ["live-vast-000001"]
    # found by the simulation: the window runs from the last try, when the destroy happened
    assert spent[0]["at_epoch"] > seen[0][0]["at_epoch"]


@pytest.mark.parametrize(("setting", "says"), [
    ("disruption_fraction = 0", "disruption_fraction: more than 0 and at most 1, got 0"),
    ("disruption_fraction = 1.5", "disruption_fraction: more than 0 and at most 1, got 1.5"),
    ("disruption_fraction = true", "disruption_fraction: expected int or float, got bool"),
    ("disruption_window_s = 1e10", "disruption_window_s: at most 604800 s"),
    ("disruption_window_s = 0", "disruption_window_s: must be positive"),
])
def test_a_disruption_setting_out_of_bounds_is_refused(tmp_path: Path, setting: str,
                                                       says: str) -> None:
    text = TOML.format(tmp=tmp_path, budget=100, grace=600).replace(
        "[loop]\n", f"[loop]\n{setting}\n")
    with pytest.raises(ConfigError, match=says.replace("(", r"\(")):
        config.parse(tomllib.loads(text), tmp_path / "fleet.toml")
