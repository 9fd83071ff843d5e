"""`fleet.ops.owed`: what the standing roster is owed, from plain rows and remembered re-rents
(the roster of test_loop: one RTX 4090 on vast for the standing role `live`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from loop_fixture import TOML

from fleet.core import config
from fleet.core.boxes import Row
from fleet.core.verdicts import Owed
from fleet.ops import owed

NOW, EARLIER = "2026-12-05T12:00:00Z", "2026-12-05T09:00:00Z"


def cfg(tmp_path: Path) -> config.Config:
    return config.parse(tomllib.loads(TOML.format(tmp=tmp_path, budget=100, grace=600)),
                        tmp_path / "fleet.toml")


def box(label: str, **kw: object) -> Row:
    fields: dict[str, object] = {"status": "running", "provider_id": "1"} | kw
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, **fields)  # type: ignore[arg-type]


def rerent(of: str, card: str = "RTX 4090", role: str = "live") -> Owed:
    return Owed(role, "vast", card, 1, EARLIER, rerent_of=of)


def test_an_empty_roster_place_is_owed_and_keeps_when_it_was_first_owed(tmp_path: Path) -> None:
    kept, out = owed.owed(cfg(tmp_path), [], [], [Owed("live", "vast", "RTX 4090", 1, EARLIER)],
                          NOW)
    assert kept == [] and [(o.shape(), o.since) for o in out] == \
        [(("live", "vast", "RTX 4090", 1), EARLIER)]


def test_a_rerent_is_owed_once_and_fills_the_roster_place(tmp_path: Path) -> None:
    dead = box("a", status="destroyed", destroyed_at=NOW)
    kept, out = owed.owed(cfg(tmp_path), [dead], [rerent("a")], [], NOW)
    assert [o.rerent_of for o in kept] == ["a"] and [o.rerent_of for o in out] == ["a"]


def test_a_rerent_replaced_by_a_live_row_or_a_move_is_owed_no_more(tmp_path: Path) -> None:
    for row in (box("a-r1", rerent_of="a"), box("b", move_of="a")):
        assert owed.owed(cfg(tmp_path), [row], [rerent("a")], [], NOW) == ([], [])


def test_a_rerent_past_the_roster_is_dropped(tmp_path: Path) -> None:
    kept, out = owed.owed(cfg(tmp_path), [box("adopted")], [rerent("a")], [], NOW)
    assert kept == [] and out == []


def test_a_rerent_of_a_role_fleet_toml_no_longer_has_is_kept_never_rented(
        tmp_path: Path) -> None:
    gone = rerent("x", role="retired")
    kept, out = owed.owed(cfg(tmp_path), [box("a")], [gone], [], NOW)
    assert kept == [gone] and out == []


def test_a_box_the_registry_wants_destroyed_fills_no_place(tmp_path: Path) -> None:
    kept, out = owed.owed(cfg(tmp_path), [box("a", destroy_wanted="over budget")], [], [], NOW)
    assert [o.shape() for o in out] == [("live", "vast", "RTX 4090", 1)]
