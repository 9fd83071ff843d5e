"""A tick's SSH checks shared between operator machines through PostgreSQL
(`fleet.state.claims`, `fleet.ops.shared_check`): two workers never check the same box in one
tick, a worker killed holding a claim delays its boxes until the claim expires and the leader
checks them itself, a result stored under a token that no longer holds is ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
from leader_loop import wait_for
from repo_root import ROOT

from fleet.boxes.inventory import Built
from fleet.core import config
from fleet.core.verdicts import Health
from fleet.ops import shared_check
from fleet.state import claims
from fleet.state.db import open_url

WORKER = """
import sys, time
from fleet.state import claims
from fleet.state.db import open_url
c = claims.claim(open_url(sys.argv[1]), 1, float(sys.argv[2]))
print("claimed", c.hosts[0][0] if c else None, flush=True)
time.sleep(3600)  # checking, until killed
"""


@pytest.fixture
def cfg(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> config.Config:
    monkeypatch.setenv("FLEET_DATABASE_URL", pg_url)
    text = (f'[fleet]\nregistry = "{tmp_path}/state/boxes.json"\n'
            f'ssh_key = "{tmp_path}/state/ssh/fleet"\n')
    return config.parse(tomllib.loads(text), tmp_path / "fleet.toml")


def hosts(n: int) -> list[tuple[str, dict[str, Any]]]:
    return [(f"live-{i:02d}", {"ssh_hostname": f"10.0.0.{i}", "ssh_port": 22, "role": "live",
                               "provider": "vast"}) for i in range(n)]


def verdict(label: str, who: str) -> Health:
    return Health(label, "vast", ssh=True, agent=True, problems=[f"checked by {who}"],
                  peers_in=3, peer_list=[{"id": "p1", "addr": "1.2.3.4:30303"}])


def test_two_workers_never_check_the_same_box_in_one_tick(
        cfg: config.Config, pg_url: str) -> None:
    db = open_url(pg_url)
    claims.post(db, 7, hosts(12))
    checked: dict[str, list[str]] = {"a": [], "b": []}
    b_claimed = threading.Event()

    def check_as(who: str) -> Any:
        def check(_cfg: Any, built: Built) -> list[Health]:
            labels = [label for label, _ in built.groups["standing"]]
            checked[who].extend(labels)
            if who == "b":
                b_claimed.set()
            elif not b_claimed.wait(60):  # a holds its batch while b claims one
                raise AssertionError("b never claimed a batch while a held one")
            return [verdict(label, who) for label in labels]
        return check

    def worker(who: str) -> None:
        while shared_check.work(cfg, check_as(who), limit=4):
            pass

    a = threading.Thread(target=worker, args=("a",))
    a.start()
    wait_for("a claims a batch", lambda: checked["a"])
    b = threading.Thread(target=worker, args=("b",))
    b.start()
    a.join(120)
    b.join(120)
    both = checked["a"] + checked["b"]
    assert checked["a"] and checked["b"], checked
    assert sorted(both) == [label for label, _ in hosts(12)], checked  # each once, all of them
    got = claims.results(db, 7)
    assert {label: h.problems[0] for label, h in got.items()} == {
        label: f"checked by {who}" for who, labels in checked.items() for label in labels}
    assert got["live-00"].to_dict() == verdict("live-00", got["live-00"].problems[0][11:]
                                               ).to_dict()  # the whole health round-trips


def test_a_worker_killed_with_a_claim_leaves_its_box_to_the_leader_once_it_expires(
        cfg: config.Config, pg_url: str) -> None:
    db = open_url(pg_url)
    checked: list[str] = []
    worker: list[subprocess.Popen[str]] = []

    def check(_cfg: Any, built: Built) -> list[Health]:
        labels = [label for label, _ in built.groups["standing"]]
        if not worker:  # the leader's first batch: a worker claims the other box meanwhile
            p = subprocess.Popen([sys.executable, "-c", WORKER, pg_url, "1.0"],
                                 stdout=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
            worker.append(p)
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "claimed live-01"
            p.send_signal(signal.SIGKILL)
            p.wait()
        checked.extend(labels)
        return [verdict(label, "the leader") for label in labels]

    health = shared_check.lead(db, cfg, 3, hosts(2), check, wait_s=60, limit=1, claim_s=60)
    assert checked == ["live-00", "live-01"]
    assert [h.label for h in health] == ["live-00", "live-01"]
    assert [h.problems for h in health] == [["checked by the leader"]] * 2


def test_the_leader_takes_over_a_claim_unanswered_when_its_wait_ends(
        cfg: config.Config, pg_url: str) -> None:
    db = open_url(pg_url)
    checked: list[str] = []
    held: list[claims.Claim] = []

    def check(_cfg: Any, built: Built) -> list[Health]:
        if not held:  # another machine claims the other box, far from expiring, and hangs
            c = claims.claim(open_url(pg_url), 1, 3600)
            assert c is not None
            held.append(c)
        checked.extend(label for label, _ in built.groups["standing"])
        return [verdict(label, "the leader") for label, _ in built.groups["standing"]]

    health = shared_check.lead(db, cfg, 4, hosts(2), check, wait_s=0.5, limit=1)
    assert [label for label, _ in held[0].hosts] == ["live-01"]
    assert checked == ["live-00", "live-01"]
    assert [h.problems for h in health] == [["checked by the leader"]] * 2
    assert claims.store(db, held[0], [verdict("live-01", "late")]) == []  # its token went
    assert claims.results(db, 4)["live-01"].problems == ["checked by the leader"]


def test_a_result_stored_under_a_stale_token_is_ignored(pg_url: str) -> None:
    db = open_url(pg_url)
    claims.post(db, 5, hosts(2))
    first = claims.claim(db, 2, 3600)
    assert first is not None and len(first.hosts) == 2
    again = claims.take_over(db, 5)  # the leader's, at the end of its wait
    assert again is not None and again.token != first.token
    assert claims.store(db, first, [verdict("live-00", "the first")]) == []
    assert claims.results(db, 5) == {}
    assert [h.label for h in claims.store(db, again, [verdict("live-00", "the leader")])] == [
        "live-00"]
    assert claims.store(db, first, [verdict("live-01", "the first")]) == []
    got = claims.results(db, 5)
    assert list(got) == ["live-00"] and got["live-00"].problems == ["checked by the leader"]
    assert claims.unanswered(db, 5) == 1


@pytest.mark.parametrize("stored", ["1", "null", "[]", '"x"', "{not json", '{"label": 1}'])
def test_a_result_that_does_not_read_is_no_result(pg_url: str, stored: str) -> None:
    """Whatever another machine left in a result, its box is checked again, never read as a
    verdict, and the other boxes' results still count."""
    db = open_url(pg_url)
    claims.post(db, 5, hosts(2))
    with db.write() as tx:
        tx.q("UPDATE check_claims SET result = ? WHERE label = 'live-00'", (stored,))
        tx.q("UPDATE check_claims SET result = ? WHERE label = 'live-01'",
             (json.dumps(verdict("live-01", "another").to_dict()),))
    assert list(claims.results(db, 5)) == ["live-01"]


def test_a_standby_loop_checks_its_share_between_its_polls_for_the_lead(
        cfg: config.Config, pg_url: str) -> None:
    from fleet.ops import loop
    from fleet.state.leader import Leadership

    db = open_url(pg_url)
    leading = Leadership(db, holder="the leader")
    assert leading.campaign() is not None
    by_standby: list[str] = []
    said: list[str] = []

    def standby_check(_cfg: Any, built: Built) -> list[Health]:
        labels = [label for label, _ in built.groups["standing"]]
        by_standby.extend(labels)
        return [verdict(label, "the standby") for label in labels]

    done = threading.Event()
    failed: list[BaseException] = []

    def standby_work() -> int:
        if done.is_set():  # the test is over: the standby stops here
            raise KeyboardInterrupt
        return shared_check.work(cfg, standby_check, limit=2)

    def never(_fence: Any) -> Any:
        if not done.is_set():
            failed.append(AssertionError("the standby led while the leader held the lead"))
        raise KeyboardInterrupt

    def standby() -> None:
        try:
            loop.lead(Leadership(open_url(pg_url), holder="the standby"), never, 1.0, False,
                      lambda _t: None, said.append, poll_s=0.05, standby_work=standby_work)
        except KeyboardInterrupt:
            pass
        except BaseException as e:
            failed.append(e)

    def leader_check(_cfg: Any, built: Built) -> list[Health]:
        labels = [label for label, _ in built.groups["standing"]]
        wait_for("the standby checks a batch", lambda: by_standby)
        return [verdict(label, "the leader") for label in labels]

    t = threading.Thread(target=standby)
    t.start()
    try:
        health = shared_check.lead(db, cfg, 9, hosts(6), leader_check, wait_s=60, limit=2)
    finally:
        done.set()
        leading.resign()
        t.join(60)
    assert failed == [] and not t.is_alive()
    assert said and said[0].startswith("standby: the loop of the leader (epoch 1")
    assert by_standby and len(by_standby) < 6, by_standby
    assert [h.label for h in health] == [label for label, _ in hosts(6)]
    assert {h.label for h in health if h.problems == ["checked by the standby"]} == \
        set(by_standby)
