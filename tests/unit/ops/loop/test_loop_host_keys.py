"""The loop and a standing box that presents another SSH host key than the one pinned: re-pinned
only on its provider's own word that this is the same box restarted since it last answered
(RunPod, whose container disk, and the keys on it, is new after a restart), once per restart;
anything else (Vast, which keeps its disk; another machine; no restart listed; a clock of the
fleet's own) refuses, and the box is judged as any box whose SSH does not answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loop_fixture import FakeVast, make

from fleet.boxes import lifecycle
from fleet.boxes.boxssh import KEY_REFUSED
from fleet.core.boxes import Row
from fleet.core.verdicts import Health
from fleet.providers.base import Box

PINNED = "ssh-ed25519 AAAA"
NEW = "ssh-ed25519 BBBBNEW"
DAYS = 3 * 86400.0


def pod(loop: Any, runpod: FakeVast, n: int, provider: str = "runpod") -> Row:
    label = f"live-{loop.reg.fleet_id()}-{provider}-{n:06x}"
    row = Row(label=label, provider=provider, role="live", kind="standing", card="RTX 4090",
              gpu_count=1, usd_per_hour=0.3, status="running", provider_id=f"p{n}",
              host_key=PINNED, ssh_host=f"10.0.0.{n}", ssh_port=22, standing=True)
    loop.reg.add(row)
    runpod.listed[f"p{n}"] = Box(provider, f"p{n}", label, "RTX 4090", 1, 0.3, "running",
                                 ssh_host=f"10.0.0.{n}", ssh_port=22, machine_id=f"m{n}",
                                 uptime_s=DAYS)
    return row


def fleet(tmp_path: Path, provider: str = "runpod", boxes: int = 3) -> tuple[Any, FakeVast,
                                                                             list[Row]]:
    """A loop over `boxes` standing boxes of `provider`, each answered once under its key."""
    loop, vast, _ = make(tmp_path)
    fake = vast
    if provider == "runpod":
        fake = FakeVast()
        fake.name = "runpod"
        loop.providers["runpod"] = fake
    rows = [pod(loop, fake, n, provider) for n in range(1, boxes + 1)]
    loop.check_fn = refusing(set())
    loop.tick()  # every box answers: what its provider listed then is remembered
    return loop, fake, rows


def refusing(labels: set[str]) -> Any:
    """A check where the boxes of `labels` refuse the fleet's SSH on their host key."""
    def check(_cfg: Any, built: Any) -> list[Health]:
        return [Health(lb, "x", ssh=lb not in labels, agent=lb not in labels,
                       problems=[f"ssh: {KEY_REFUSED}"] if lb in labels else [])
                for lb, _ in built.groups["standing"]]
    return check


def said(t: Any, label: str) -> str:
    return " | ".join(a for a in t.actions if label in a)


def test_a_restarted_pod_with_a_new_key_is_repinned_on_runpods_word_and_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, runpod, rows = fleet(tmp_path)
    label = rows[0].label
    runpod.listed["p1"].uptime_s = 30.0  # restarted since it last answered, up 3 days
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *a, **k: NEW)
    loop.check_fn = refusing({label})
    t = loop.tick()
    assert loop.reg.get(label).host_key == NEW
    assert "SSH host key re-pinned" in said(t, label) and label not in t.dead


def test_one_restart_explains_one_new_key_only(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    loop, runpod, rows = fleet(tmp_path)
    label = rows[0].label
    runpod.listed["p1"].uptime_s = 30.0
    keys = iter(f"ssh-ed25519 ROTATING{i}" for i in range(100))
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *a, **k: next(keys))
    loop.check_fn = refusing({label})
    pinned, lines, dead = [], [], []
    for i in range(3):
        runpod.listed["p1"].uptime_s = 30.0 + 60 * i  # no second restart
        t = loop.tick()
        pinned.append(loop.reg.get(label).host_key)
        lines.append(said(t, label))
        dead.append(label in t.dead)
    assert len(set(pinned)) == 1 and pinned[0] != PINNED, pinned
    assert "re-pinned" in lines[0] and "no restart since it last answered" in lines[1]
    assert dead == [False, True, True]  # then judged as a box that does not answer


@pytest.mark.parametrize("case", ["answered after its restart", "another machine",
                                  "no uptime listed", "vast keeps its disk"])
def test_a_changed_key_without_the_providers_restart_word_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    provider = "vast" if case == "vast keeps its disk" else "runpod"
    loop, fake, rows = fleet(tmp_path, provider)
    label, box = rows[0].label, fake.listed["p1"]
    if case == "answered after its restart":
        box.uptime_s = 600.0  # restarted, and answered under its pinned key since (kept keys)
        loop.tick()
        box.uptime_s = 660.0  # whatever the fleet's clock says of when that was
    box.uptime_s = {"answered after its restart": 660.0, "no uptime listed": None}.get(
        case, 30.0)
    if case == "another machine":
        box.machine_id = "m999"
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *a, **k: NEW)
    loop.check_fn = refusing({label})
    t = loop.tick()
    assert loop.reg.get(label).host_key == PINNED
    assert "not re-pinned" in said(t, label)


def test_every_box_refusing_on_its_key_is_the_fleets_own_blindness_not_deaths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy on the operator's side presenting its own key for every box: nothing dies."""
    loop, runpod, rows = fleet(tmp_path)
    monkeypatch.setattr(lifecycle, "fetch_host_key", lambda *a, **k: NEW)
    loop.check_fn = refusing({r.label for r in rows})
    for _ in range(4):
        t = loop.tick()
        assert t.dead == {} or all("blind" in a or "breaker" in a for a in t.actions
                                   if "dead" in a)
    assert runpod.destroyed == []
    assert all(loop.reg.get(r.label).host_key == PINNED for r in rows)
