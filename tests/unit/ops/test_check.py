"""`fleet check`'s verdicts from an agent's status (no SSH: the judging only)."""

from check_fixture import DATA, status

from fleet.ops.check import judge


def test_well_box() -> None:
    h = judge("b", DATA, status(), "ab" * 8, None)
    assert h.well and h.exec_moving and h.problems == []


def test_unreachable_and_uninstalled() -> None:
    assert judge("b", DATA, None, None, None).problems == ["ssh: box did not answer"]
    assert judge("b", DATA, {}, None, None).problems == ["agent: not installed"]


def test_refused_driver_is_named() -> None:
    s = status(admission={"admitted": False,
                          "reason": "driver 580.82.07 is not the admitted 580.95.05"})
    h = judge("b", DATA, s, None, None)
    assert not h.well and any("580.82.07" in p for p in h.problems)


def test_exec_tip_judged_against_the_last_different_reading() -> None:
    s = status()
    same_reading = {"exec_tip": 1298, "rpc_at": "2026-12-02T10:00:00Z", "moving": True}
    assert judge("b", DATA, s, None, same_reading).exec_moving  # no new reading: as before
    older = {"exec_tip": 1298, "rpc_at": "2026-12-02T09:59:45Z", "moving": True}
    stuck = judge("b", DATA, s, None, older)
    assert not stuck.exec_moving and "node: exec tip stuck at 1298" in stuck.problems
    zero = status(node={"sha16": None, "rpc": {"synced": True, "blocks": 1300, "exec_tip": 0},
                        "rpc_at": "x"})
    assert not judge("b", DATA, zero, None, None).exec_moving


def test_wrong_binary_and_degraded_program() -> None:
    s = status()
    s["programs"]["prover"] = {"state": "backoff", "degraded": True, "reason": "crash loop"}
    h = judge("b", DATA, s, "cd" * 8, None)
    assert f"node: runs {'ab' * 8}, wanted {'cd' * 8}" in h.problems
    assert "prover: degraded (crash loop)" in h.problems


def test_a_frozen_reading_is_unknown_never_moving() -> None:
    """The observer stopped: the status is still written, its node reading is 2 minutes old.
    Even with a previous verdict of "moving" for that same reading, it is not well."""
    s = status(ts="2026-12-02T10:02:00Z")
    same_reading = {"exec_tip": 1298, "rpc_at": "2026-12-02T10:00:00Z", "moving": True}
    h = judge("b", DATA, s, None, same_reading)
    assert not h.well
    assert h.exec_moving is None and h.synced is None
    assert "node: reading is 121.0 s old (unknown)" in h.problems


def test_an_old_status_a_dead_observer_and_a_full_disk_are_named() -> None:
    s = status(status_age_s=300.0, observer={"alive": False, "last_error": "boom"},
               storage={"ok": False, "error": "cannot write run/status.json: No space left"},
               disk={"free_bytes": {"run": 0, "out": 4096}, "full": True})
    h = judge("b", DATA, s, None, None)
    assert h.problems[0] == "disk full: out/ has 4096 bytes free, run/ has 0 bytes free"
    assert "agent: status not written for 300.0 s" in h.problems
    assert "agent: observer not running (boom)" in h.problems
    assert "agent: cannot write run/status.json: No space left" in h.problems
    assert not h.well


def test_a_status_without_freshness_fields_is_not_well() -> None:
    s = status()
    for key in ("status_age_s", "observer"):
        del s[key]
    h = judge("b", DATA, s, None, None)
    assert not h.well and h.exec_moving is None


def test_an_unknown_admission_is_unknown_never_a_refusal() -> None:
    # `agent status` before the agent wrote one has no admission (the contract's StatusDoc:
    # NotRequired): the box is not well, but nothing refused it
    s = status()
    del s["admission"]
    h = judge("b", DATA, s, "ab" * 8, None)
    assert h.admitted is None and h.problems == ["admission: unknown"]
    refused = judge("b", DATA, status(admission={"admitted": False, "reason": "driver 1.0"}),
                    "ab" * 8, None)
    assert refused.problems == ["admission refused: driver 1.0"]


def test_an_unknown_value_in_a_problem_reads_as_a_question_mark_never_none() -> None:
    s = status(alive=False, heartbeat_age_s=None, status_age_s=None,
               observer={"alive": False, "restarts": 0, "last_error": None},
               node={"sha16": None, "rpc": None, "rpc_error": None, "rpc_at": None},
               programs={"node": {"state": "running"}, "miner": {"state": "running"},
                         "prover": {"state": "running", "degraded": True, "reason": None}})
    h = judge("b", DATA, s, "ab" * 8, None)
    assert [p for p in h.problems if "None" in p] == []
    assert "agent: not alive (heartbeat ?s old)" in h.problems
    assert "agent: status not written for ? s" in h.problems
    assert "agent: observer not running (?)" in h.problems
    assert "node: no RPC (?)" in h.problems
    assert f"node: runs ?, wanted {'ab' * 8}" in h.problems
    assert "prover: degraded (?)" in h.problems
