"""An agent's status as `fleet check` reads it: a well box's, with `over` replacing its
top-level keys, and the provider's data for the judging."""

from typing import Any

DATA = {"provider": "vast"}


def status(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "alive": True, "heartbeat_age_s": 1.0, "status_age_s": 1.0,
        "ts": "2026-12-02T10:00:01Z", "agent": {"tick_s": 15},
        "observer": {"alive": True, "restarts": 0, "last_error": None},
        "storage": {"ok": True, "error": None},
        "disk": {"free_bytes": {"run": 10**9, "out": 10**9}, "full": False},
        "node": {"sha16": "ab" * 8, "rpc": {"synced": True, "blocks": 1300, "exec_tip": 1298},
                 "rpc_at": "2026-12-02T10:00:00Z"},
        "programs": {"node": {"state": "running"}, "miner": {"state": "running"},
                     "prover": {"state": "running"}},
        "admission": {"admitted": True, "reason": "driver 580.95.05, 1 GPU(s)"},
        "prover": {"state": "proving"},
    }
    s.update(over)
    return s
