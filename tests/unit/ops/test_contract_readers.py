"""Fleet's readers of the agent's documents read only keys the agent writes: each reader is
given a document whose every object notes a key asked of it that its TypedDict in
`agent.contract` does not declare (a key the agent never writes reads as None for ever, which
mypy cannot see in a `.get`)."""

from __future__ import annotations

import types
import typing
from datetime import UTC, datetime, timedelta
from typing import Any

from agent import contract
from fleet.boxes import jobstate
from fleet.ops import check, storage


def _strip(hint: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner[0] if len(inner) == 1 else hint
    return hint


class Reads(dict[str, Any]):
    """A document that notes, in `undeclared`, each key read of it that `td` does not name."""

    def __init__(self, data: dict[str, Any], td: Any, where: str,
                 undeclared: list[str]) -> None:
        self.keys_of = td.__required_keys__ | td.__optional_keys__
        self.where, self.undeclared = where, undeclared
        hints = typing.get_type_hints(td)
        super().__init__({k: watched(v, hints.get(k), f"{where}.{k}", undeclared)
                          for k, v in data.items()})

    def _see(self, key: object) -> None:
        if key not in self.keys_of:
            self.undeclared.append(f"{self.where}.{key}")

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        self._see(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self._see(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self._see(key)
        return super().__contains__(key)


def watched(value: Any, hint: Any, where: str, undeclared: list[str]) -> Any:
    hint = _strip(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(value, dict) and typing.is_typeddict(hint):
        return Reads(value, hint, where, undeclared)
    if isinstance(value, dict) and origin is dict and typing.is_typeddict(_strip(args[1])):
        return {k: watched(v, args[1], f"{where}[{k}]", undeclared) for k, v in value.items()}
    if isinstance(value, list) and origin is list and typing.is_typeddict(_strip(args[0])):
        return [watched(v, args[0], f"{where}[]", undeclared) for v in value]
    return value


def program(state: str, **over: Any) -> dict[str, Any]:
    return {"state": state, "pid": 10, "reason": None, "degraded": False, **over}


def status(**over: Any) -> dict[str, Any]:
    """A status as `agent status` prints it (the parts `fleet check` reads)."""
    s: dict[str, Any] = {
        "schema": 1, "ts": "2026-12-02T10:00:01Z",
        "alive": True, "agent_pid": 7, "heartbeat_age_s": 1.0, "status_age_s": 1.0,
        "agent": {"tick_s": 15, "pid": 7},
        "observer": {"alive": True, "restarts": 0, "last_error": None},
        "storage": {"ok": True, "error": None},
        "disk": {"free_bytes": {"run": 10**9, "out": 5}, "total_bytes": {"run": 10**10,
                                                                          "out": 10**10},
                 "full": True},
        "node": {"sha16": "ab" * 8, "rpc_at": "2026-12-02T10:00:00Z", "rpc_error": None,
                 "rpc": {"synced": True, "blocks": 1300, "exec_tip": 1298, "peers_in": 2,
                         "peers_out": 3, "peer_list": [{"dir": "in", "remote": "1.2.3.4:5",
                                                        "public": True}]}},
        "programs": {"node": program("running"), "miner": program("backoff", degraded=True),
                     "prover": program("running")},
        "admission": {"admitted": False, "reason": "driver 1.0"},
        "prover": {"state": "idle", "status_error": None},
    }
    s.update(over)
    return s


def judged(doc: dict[str, Any], previous: dict[str, Any] | None = None) -> list[str]:
    undeclared: list[str] = []
    check.judge("b", {"provider": "vast"}, Reads(doc, contract.StatusDoc, "status", undeclared),
                "cd" * 8, previous)
    return undeclared


def test_the_checker_notes_a_key_the_contract_does_not_name() -> None:
    undeclared: list[str] = []
    doc = Reads(status(), contract.StatusDoc, "status", undeclared)
    assert doc["node"].get("binary_sha") is None
    assert undeclared == ["status.node.binary_sha"]


def test_fleet_check_reads_only_what_the_status_declares() -> None:
    assert judged(status()) == []
    assert judged(status(), {"exec_tip": 1200, "rpc_at": "2026-12-02T09:59:00Z"}) == []
    stale = status(status_age_s=400.0)
    assert judged(stale) == []
    no_rpc = status()
    no_rpc["node"] = {**no_rpc["node"], "rpc": None, "rpc_error": "refused"}
    assert judged(no_rpc) == []


def test_a_jobs_state_is_read_only_by_the_keys_it_has() -> None:
    undeclared: list[str] = []
    state = Reads({"phase": "refused", "invocations": 0, "deadline_at": None,
                   "started_at": 1.7e9, "refused": {"step": "gpu", "reason": "driver"}},
                  contract.JobStateDoc, "state", undeclared)
    assert jobstate.job_fields(state)["refusal"] == "gpu: driver"
    at = jobstate.deadline({"ttl_minutes": 30}, state)
    assert at == datetime.fromtimestamp(1.7e9, UTC) + timedelta(minutes=30)
    assert undeclared == []


def test_a_storage_review_is_read_only_by_the_keys_it_has() -> None:
    undeclared: list[str] = []
    review = Reads({"root": "/root/fleet", "categories": [{"name": "logs", "bytes": 1}],
                    "freeable_bytes": 1}, contract.StorageReview, "review", undeclared)
    assert storage.unknown_category(review, {"logs": (True, "")}) is None
    assert undeclared == []
