"""One leader loop per fleet: a lease held on the database's side, and an epoch that fences it.

A loop leads while it holds the leader lock: on PostgreSQL an advisory lock on a session of
its own (it ends when that session does: the loop killed, its machine gone, the network cut),
on SQLite an exclusive `flock` on `<fleet.db>.leader` (it ends with the process). Taking it
bumps the `leader` row's epoch in a write transaction; every rent and destroy of the loop
checks, in its own write transaction, that the row still holds its epoch (`Fence.check`). So a
loop paused while another took over, or one whose session dropped and came back, can never
act: its epoch is behind. A loop that lost the lead (`Leadership.lost`) stops acting and
campaigns again from the start; it never carries on.

A loop that cannot take the lock waits as a standby and says whose loop leads (`current`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fleet.core.errors import NotLeader, StateError
from fleet.core.times import now_iso
from fleet.state import locks
from fleet.state.db import CONNECT_S, Database, SQLite, Tx, describe


@dataclass(frozen=True)
class Lead:
    """The leader row: who leads (or led last), since when, and its epoch."""

    epoch: int
    holder: str
    since: str
    seen_at: str


@dataclass(frozen=True)
class Fence:
    """A leader's epoch: what its rents and destroys check. On PostgreSQL also the server's
    process of the session that holds the lock: a session that ended (the loop's machine cut
    off, the server restarted) ends the lead at once, before any other loop took it over."""

    epoch: int
    holder: str
    session_pid: int | None = field(default=None, compare=False)

    def check(self, tx: Tx) -> None:
        found = tx.one("SELECT epoch, holder FROM leader WHERE id = 1")
        if found is None or int(found[0]) != self.epoch:
            now = "none" if found is None else f"epoch {found[0]}, {found[1]}"
            raise NotLeader(f"this loop (epoch {self.epoch}) no longer leads (now {now}): "
                            "it acts no more")
        if self.session_pid is not None and tx.one(
                "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = ? "
                "AND classid::bigint = ? AND objsubid = 2 AND objid::bigint = "
                f"({locks.SCHEMA_KEY}::bigint & 4294967295) AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (self.session_pid, locks.LEADER)) is None:
            raise NotLeader(f"this loop (epoch {self.epoch}) no longer leads: its database "
                            "session that held the lead has ended; it acts no more")


def current(tx: Tx) -> Lead | None:
    found = tx.one("SELECT epoch, holder, since, seen_at FROM leader WHERE id = 1")
    return None if found is None else Lead(int(found[0]), str(found[1]), str(found[2]),
                                           str(found[3]))


def me() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


class Leadership:
    """This process's campaign for the lead of the fleet in `db`."""

    def __init__(self, db: Database, holder: str | None = None) -> None:
        self.db = db
        self.holder = holder or me()
        self.fence: Fence | None = None
        self._file: IO[str] | None = None  # SQLite: the flocked file
        self._session: Any = None  # PostgreSQL: the session that holds the advisory lock
        self._session_pid: int | None = None  # ... its server process

    def current(self) -> Lead | None:
        with self.db.read() as tx:
            return current(tx)

    def campaign(self) -> Fence | None:
        """Take the lead if no one holds it: the new epoch's fence, or None (a standby)."""
        if self.fence is not None:
            return self.fence
        if not self._lock():
            return None
        try:
            with self.db.write() as tx:
                lead = current(tx)
                epoch = (lead.epoch if lead else 0) + 1
                now = now_iso()
                tx.q("INSERT INTO leader (id, epoch, holder, since, seen_at) "
                     "VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                     "epoch = excluded.epoch, holder = excluded.holder, "
                     "since = excluded.since, seen_at = excluded.seen_at",
                     (epoch, self.holder, now, now))
        except BaseException:
            self._unlock()
            raise
        self.fence = Fence(epoch, self.holder, self._session_pid)
        return self.fence

    def lost(self) -> str | None:
        """Why this process no longer leads, or None while it does (its session answers and
        the row holds its epoch). Also marks it seen, for a standby to show."""
        if self.fence is None:
            return "it never took the lead"
        why = self._session_lost()
        if why is None:
            try:
                with self.db.write() as tx:
                    self.fence.check(tx)
                    tx.q("UPDATE leader SET seen_at = ? WHERE id = 1", (now_iso(),))
            except NotLeader as e:
                why = str(e)
            except StateError as e:
                why = f"the database did not answer ({e})"
        if why is not None:
            self.resign()
        return why

    def resign(self) -> None:
        """Let go: a loop that lost the lead campaigns again from the start."""
        self.fence = None
        self._unlock()

    # the lock itself, per backend
    def _lock(self) -> bool:
        if isinstance(self.db, SQLite):
            return self._flock()
        return self._advisory()

    def _flock(self) -> bool:
        assert isinstance(self.db, SQLite)
        # the file itself, whatever path named it: two paths to one database share one lead
        path = Path(os.path.realpath(self.db.path) + ".leader")
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")  # noqa: SIM115 (held while leading)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return False
        self._file = f
        return True

    def _advisory(self) -> bool:
        import psycopg

        try:
            session = psycopg.connect(self.db.url, autocommit=True, connect_timeout=CONNECT_S)
            got = session.execute(f"SELECT pg_try_advisory_lock(%s, {locks.SCHEMA_KEY})",
                                  (locks.LEADER,)).fetchone()
        except psycopg.Error as e:
            raise StateError(f"state database {describe(self.db.url)}: cannot campaign: "
                             f"{str(e).strip().splitlines()[0] if str(e).strip() else e}"
                             ) from None
        if not (got and got[0]):
            session.close()
            return False
        pid = session.execute("SELECT pg_backend_pid()").fetchone()
        self._session, self._session_pid = session, int(pid[0]) if pid else None
        return True

    def _session_lost(self) -> str | None:
        if self._session is None:
            return None
        try:
            self._session.execute("SELECT 1").fetchone()
        except Exception as e:
            return f"its database session dropped ({type(e).__name__})"
        return None

    def _unlock(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._session.close()
            self._session, self._session_pid = None, None
