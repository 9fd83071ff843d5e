"""`fleet destroy`: a row without a provider id, a provider that cannot be asked, standing kinds.

The provider side is the sandbox's fake APIs over real HTTP (see cli_sandbox).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_sandbox import FleetRun
from loopback_sshd import Sshd

from facts.box import AgentStatus
from fleet.boxes import boxssh, sshmux
from fleet.boxes.sshkeys import write_known_hosts


@pytest.mark.parametrize("provider", ["vast", "runpod"])
def test_row_without_id_destroys_the_box_carrying_its_label(fleet: FleetRun,
                                                            provider: str) -> None:
    # a rent that crashed after its create landed: the row never learnt the box's id
    label = f"bench-{fleet.reg.fleet_id()}-{provider}-0a0a0a"  # a label the fleet made
    box = fleet.land(provider, label)
    fleet.row(label, provider=provider, status="renting")
    r = fleet("destroy", label)
    assert r.code == 0, r.err
    assert fleet.boxes(provider, label) == []  # nothing with the label bills
    assert fleet.client(provider).box(box.box_id) is None
    (row,) = fleet.reg.rows()
    assert row.status == "destroyed" and row.destroyed_at and row.provider_id == box.box_id


def test_row_without_id_and_no_box_is_marked_destroyed(fleet: FleetRun) -> None:
    fleet.row("bench-x-2", status="renting")
    r = fleet("destroy", "bench-x-2", "--force")  # a hand label: whatever carries it goes
    assert r.code == 0, r.err
    (row,) = fleet.reg.rows()
    assert row.status == "destroyed" and row.destroyed_at and row.provider_id is None


def test_dry_run_names_the_box_it_found_and_changes_nothing(fleet: FleetRun) -> None:
    label = f"bench-{fleet.reg.fleet_id()}-vast-0b0b0b"
    box = fleet.land("vast", label)
    fleet.row(label, status="renting")
    before = fleet.registry_bytes()
    r = fleet("destroy", label, "--dry-run")
    assert r.code == 0, r.err
    assert f"would destroy {label} (vast {box.box_id}" in r.out
    assert fleet.registry_bytes() == before
    assert [b.box_id for b in fleet.boxes("vast", label)] == [box.box_id]


@pytest.mark.parametrize("provider_id", [None, "12345"])
def test_provider_without_a_key_is_refused_in_one_line(fleet: FleetRun,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       provider_id: str | None) -> None:
    fleet.row("bench-x-4", status="renting", provider_id=provider_id)
    before = fleet.registry_bytes()
    monkeypatch.delenv("VAST_API_KEY")  # RunPod's key stays: the fleet still has a provider
    r = fleet("destroy", "bench-x-4", "--force")  # a hand label without an id needs it
    assert r.code == 2, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("error: "), r.err
    assert "vast" in r.err and "VAST_API_KEY" in r.err and "Traceback" not in r.err
    assert fleet.registry_bytes() == before  # row unchanged


def test_provider_that_does_not_answer_is_refused_in_one_line(fleet: FleetRun) -> None:
    box = fleet.land("vast", "bench-x-5")
    fleet.row("bench-x-5", status="renting")
    before = fleet.registry_bytes()
    fleet.sbx.world.inject("server_error", "vast", count=2)  # both tries of the lookup fail
    r = fleet("destroy", "bench-x-5", "--force")  # a hand label without an id needs it
    assert r.code == 1, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("error: "), r.err
    assert "vast" in r.err and "fleet destroy bench-x-5" in r.err
    assert fleet.registry_bytes() == before
    assert [b.box_id for b in fleet.boxes("vast", "bench-x-5")] == [box.box_id]


@pytest.mark.parametrize("provider", ["vast", "runpod"])
def test_a_box_the_key_cannot_see_stays_live_in_the_registry(fleet: FleetRun,
                                                             provider: str) -> None:
    # the box was rented on the fleet's account; the key now opens another account, where
    # the provider answers "no such box" for its id: that is not the fleet's box going
    box = fleet.land(provider, "bench-x-11")
    fleet.row("bench-x-11", provider=provider, status="running", provider_id=box.box_id)
    before = fleet.registry_bytes()
    fleet.mp.setenv(f"{provider.upper()}_API_KEY", fleet.sbx.world.add_account(provider))
    r = fleet("destroy", "bench-x-11")
    assert r.code == 1, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("error: "), r.err
    assert "another account" in r.err and "not read as destroyed" in r.err, r.err
    assert fleet.registry_bytes() == before  # still live: it may still bill
    fleet.mp.setenv(f"{provider.upper()}_API_KEY", getattr(fleet.sbx.keys, provider))
    assert fleet.client(provider).box(box.box_id) is not None


@pytest.mark.parametrize("role, kind", [("live", "standing"),   # both say standing
                                        ("live", "oneshot"),    # fleet.toml's role says so
                                        ("bench", "standing")])  # the row's kind says so
def test_box_of_a_standing_role_not_yet_converted_needs_force(fleet: FleetRun, role: str,
                                                              kind: str) -> None:
    box = fleet.land("vast", "live-x-6")
    fleet.row("live-x-6", role=role, kind=kind, status="running", provider_id=box.box_id)
    before = fleet.registry_bytes()
    r = fleet("destroy", "live-x-6")
    assert r.code == 2, r.err
    assert len(r.err_lines) == 1 and "standing" in r.err and "--force" in r.err, r.err
    assert fleet.registry_bytes() == before
    assert fleet.client("vast").box(box.box_id) is not None
    r = fleet("destroy", "live-x-6", "--force")
    assert r.code == 0, r.err
    assert fleet.client("vast").box(box.box_id) is None
    assert fleet.reg.rows()[0].status == "destroyed"


def test_a_one_shot_box_whose_outputs_were_not_read_back_needs_force(fleet: FleetRun) -> None:
    box = fleet.land("vast", "bench-x-7")
    fleet.row("bench-x-7", status="running", provider_id=box.box_id, job="j1",
              job_state="finished")
    before = fleet.registry_bytes()
    r = fleet("destroy", "bench-x-7")
    assert r.code == 2 and len(r.err_lines) == 1, r.err
    assert "not read back" in r.err and "fleet teardown bench-x-7" in r.err, r.err
    assert fleet.registry_bytes() == before
    assert fleet.client("vast").box(box.box_id) is not None
    fleet.reg.update("bench-x-7", read_back="j1")  # a `teardown --keep-box` read it back
    r = fleet("destroy", "bench-x-7")
    assert r.code == 0, r.err
    assert fleet.client("vast").box(box.box_id) is None


def test_force_destroys_a_one_shot_box_with_unread_outputs(fleet: FleetRun) -> None:
    box = fleet.land("vast", "bench-x-8")
    fleet.row("bench-x-8", status="running", provider_id=box.box_id, job="j1")
    r = fleet("destroy", "bench-x-8", "--force")
    assert r.code == 0, r.err
    assert fleet.client("vast").box(box.box_id) is None


def test_teardown_expired_goes_on_past_a_box_whose_teardown_crashes(
        fleet: FleetRun, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.core.verdicts import Watch
    from fleet.ops import teardown, watchdog

    for box_id, label in enumerate(("bench-x-9", "bench-x-10"), 1):  # a box id is one box's
        fleet.row(label, status="running", provider_id=str(box_id), job="j1")
    monkeypatch.setattr(watchdog, "watch", lambda *a: [
        Watch(label, "j1", "finished", 60.0, None, ["job finished"], due=True)
        for label in ("bench-x-9", "bench-x-10")])
    done: list[str] = []

    def teardown_one(cfg, reg, ps, label, **kw):  # type: ignore[no-untyped-def]
        if label == "bench-x-9":  # a fault that is not the fleet's own error type
            raise ValueError("Invalid `path_in_repo` in CommitOperation: '.git/HEAD'")
        done.append(label)
        return teardown.Outcome(label, "j1", destroyed=True)

    monkeypatch.setattr(teardown, "teardown", teardown_one)
    r = fleet("teardown", "--expired")
    assert r.code == 1 and done == ["bench-x-10"], r.err
    assert "bench-x-9: ValueError" in r.err and "Traceback" not in r.err


def test_a_destroyed_boxs_master_connection_is_closed(fleet: FleetRun, tmp_path: Path) -> None:
    (tmp_path / "box").mkdir()
    sshd = Sshd(tmp_path / "box")
    sshd.start()
    known = tmp_path / "state" / "known_hosts"  # the fleet's, as fleet.toml leaves it
    try:
        label = f"bench-{fleet.reg.fleet_id()}-vast-0c0c0c"
        box = fleet.land("vast", label)
        fleet.row(label, status="running", provider_id=box.box_id, ssh_host="127.0.0.1",
                  ssh_port=sshd.port, host_key=sshd.key)
        write_known_hosts(known, fleet.reg.rows())
        data = sshd.data(host_key=sshd.key, ssh_known_hosts_file=str(known))
        assert boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30).answered
        socket = sshd.master(data)
        assert sshmux.running(socket)
        r = fleet("destroy", label)
        assert r.code == 0, r.err
        assert not sshmux.running(socket) and not Path(socket).exists()
    finally:
        sshmux.close(sshd.master(sshd.data(host_key=sshd.key,
                                           ssh_known_hosts_file=str(known))))
        sshd.stop()
