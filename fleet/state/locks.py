"""PostgreSQL advisory lock keys of the fleet's state: numbers no other program of the
database uses ("fleet" and a number), as the signed 64-bit values PostgreSQL takes."""

from __future__ import annotations


def _signed(key: int) -> int:
    return key - (1 << 64) if key >= 1 << 63 else key


WRITE = _signed(0x666C6565_74000001)  # every write transaction: one writer at a time
MIGRATE = _signed(0x666C6565_74000002)  # each migration's transaction
LEADER = _signed(0x666C6565_74000003)  # the leader's session (`fleet.state.leader`)
