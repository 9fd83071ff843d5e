"""`fleet.core.states` and the death verdict: the fleet's words as enums, each the word it
always stored and said, and every provider status mapped to one at the provider's edge."""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from fleet.core.boxes import Row, unfinished
from fleet.core.states import (
    DOWN,
    LIVE,
    UNFINISHED,
    BoxKind,
    BoxStatus,
    DeathKind,
    PublishState,
    ReleaseOrder,
    node_release,
)
from fleet.core.verdicts import Death
from fleet.ops import publish
from fleet.providers import runpod, vast
from fleet.providers.base import Box
from fleet.state.registry import encode

MEMBERS = set(BoxStatus.__members__.values())


def test_the_words_are_the_ones_stored_and_said() -> None:
    assert [str(s) for s in BoxStatus] == [
        "renting", "provisioning", "running", "stopped", "exited", "unknown", "destroyed",
        "vanished", "failed", "gone"]
    assert [str(k) for k in BoxKind] == ["standing", "oneshot"]
    assert publish.STATES == ("untouched", "switched", "ahead", "reverted", "failed",
                              "unreachable")
    assert all(isinstance(s, PublishState) for s in publish.STATES)
    assert json.dumps({"status": BoxStatus.RUNNING}) == '{"status": "running"}'
    assert f"{BoxStatus.EXITED}" == "exited" and BoxStatus.EXITED == "exited"


def test_live_is_every_status_that_may_bill() -> None:
    assert {s for s in BoxStatus if s.is_live()} == LIVE == {
        "renting", "provisioning", "running", "stopped", "exited", "unknown"}
    assert UNFINISHED == {"renting", "provisioning"} and UNFINISHED <= LIVE
    assert DOWN == {"exited", "stopped"} and DOWN <= LIVE
    for ended in ("destroyed", "vanished", "failed", "gone"):
        assert not BoxStatus(ended).is_live()


@pytest.mark.parametrize("desired", ["CREATED", "RESTARTING", "RUNNING", "PAUSED", "EXITED",
                                     "DEAD", "TERMINATED", "MIGRATING", "", None])
@pytest.mark.parametrize("change", ["", "Exited by user", "Host machine is unreachable: x"])
@pytest.mark.parametrize("ssh", [True, False])
def test_every_runpod_status_maps_to_a_member(desired: str | None, change: str,
                                              ssh: bool) -> None:
    got = runpod.status_of({"desiredStatus": desired, "lastStatusChange": change}, ssh)
    assert type(got) is BoxStatus and got in MEMBERS and got.is_live()


@pytest.mark.parametrize("actual", [None, "", "loading", "created", "scheduling", "rebooting",
                                    "running", "stopped", "frozen", "exited", "offline",
                                    "unknown", "something new"])
@pytest.mark.parametrize("msg", ["", "OCI runtime create failed: error"])
def test_every_vast_status_maps_to_a_member(actual: str | None, msg: str) -> None:
    got = vast.status_of({"actual_status": actual, "status_msg": msg})
    assert type(got) is BoxStatus and got in MEMBERS and got.is_live()
    outbid = vast.status_of({"actual_status": actual, "cur_state": "stopped",
                             "intended_status": "stopped", "next_state": "stopped"})
    assert outbid is BoxStatus.STOPPED


def _row(kind: str = "standing", **kw: Any) -> Row:
    return Row("a-1", "vast", "live", kind, "RTX 4090", 1, 0.3, **kw)


def test_a_row_and_a_box_hold_members_and_store_the_same_words() -> None:
    r = _row(status="running")
    assert r.status is BoxStatus.RUNNING and r.live
    assert json.loads(encode(r))["status"] == "running"
    assert _row().status is BoxStatus.RENTING and unfinished(_row())
    assert Box("vast", "1", "a-1", "RTX 4090", 1, 0.3, "exited").status is BoxStatus.EXITED
    with pytest.raises(ValueError):
        Box("vast", "1", "a-1", "RTX 4090", 1, 0.3, "runing")


def test_a_rows_kind_is_a_member_and_a_kind_no_code_writes_is_never_standing() -> None:
    assert _row(kind="standing").kind is BoxKind.STANDING
    assert _row(kind="oneshot").kind is BoxKind.ONESHOT
    odd = _row(kind="standing!")
    assert isinstance(odd.kind, BoxKind) and odd.kind == "standing!"
    assert odd.kind not in set(BoxKind) and odd.kind != BoxKind.STANDING
    assert json.loads(encode(odd))["kind"] == "standing!"
    assert pickle.loads(pickle.dumps(odd)).kind == "standing!"


def test_a_status_no_code_writes_reads_as_it_is_and_is_never_live() -> None:
    """A row edited by hand keeps the word it holds (a re-read is the database as it is),
    typed, and is neither live nor unfinished."""
    odd = _row(status="exited!")
    assert isinstance(odd.status, BoxStatus) and odd.status == "exited!"
    assert odd.status not in MEMBERS and not odd.live and not unfinished(odd)
    assert json.loads(encode(odd))["status"] == "exited!"
    assert pickle.loads(pickle.dumps(odd)).status == "exited!"
    assert pickle.loads(pickle.dumps(BoxStatus.RUNNING)) is BoxStatus.RUNNING


def test_a_death_reads_as_the_words_said_today() -> None:
    dead = Death.dead("vast lists it as exited")
    assert dead.kind is DeathKind.DEAD and dead.reason == "vast lists it as exited"
    assert dead == "vast lists it as exited" and dead.said() == "dead (vast lists it as exited)"
    unfit = Death.unfit("its agent refused admission (gpu: driver 1 is not the admitted 2)")
    assert unfit.kind is DeathKind.UNFIT
    assert unfit == "unfit: its agent refused admission (gpu: driver 1 is not the admitted 2)"
    assert unfit.said() == "unfit (its agent refused admission (gpu: driver 1 is not the " \
                           "admitted 2))"
    # a reason that merely begins with the word is no unfit box
    assert Death.dead("unfit-looking reason").kind is DeathKind.DEAD


def test_a_death_is_a_value_that_copies_dumps_and_pickles_whole() -> None:
    d = Death.unfit("r")
    for again in (copy.copy(d), copy.deepcopy(d), pickle.loads(pickle.dumps(d))):
        assert again == d and again.kind is DeathKind.UNFIT and again.reason == "r"
    assert json.dumps({"x": d}) == '{"x": "unfit: r"}'
    with pytest.raises(AttributeError):
        d.kind = DeathKind.DEAD  # type: ignore[misc]


def test_a_node_problem_names_its_release_order() -> None:
    assert node_release("node: behind: runs v1 (a), wanted v2 (b)") is ReleaseOrder.BEHIND
    assert node_release("node: ahead: runs v3 (a), wanted v2 (b)") is ReleaseOrder.AHEAD
    assert node_release("node: runs a, wanted b") is None
    assert node_release("disk: behind on space") is None
