"""The box registry: one row per box ever rented, in the state database (`fleet.state.db`).

Rows are never deleted: a destroyed box keeps its row, marked with `destroyed_at`, so the history
of what was paid for survives. Every change is one write transaction (one writer at a time), so
a check made in it (the budget's, the label's) holds until the row lands, and a writer killed
mid-update loses nothing. The schema's unique indexes refuse what no code may write twice: a
slot's second live box, a dead box's second replacement, a provider id's second row
(`fleet.state.schema`). A row is stored as its JSON document beside the columns those indexes
read; a row that does not parse stops the program with its label: it is never silently reset.

A registry built with a `fence` (the leader's epoch, `fleet.state.leader`) checks it in every
write transaction it makes (a rent's row, an update, a destroy's mark), and the destroy and
the create ask it just before they call the provider (`check_fence`): a loop that lost the
lead can never act, nor change a row (giving up a rent would free its slot for another box).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.core.boxes import Row, unfinished
from fleet.core.errors import RegistryError, UsageError
from fleet.core.states import BoxStatus
from fleet.core.times import now_iso
from fleet.state.db import Database, Duplicate, Tx, open_db

if TYPE_CHECKING:
    from fleet.state.leader import Fence

LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
FLEET_ID_RE = re.compile(r"^[0-9a-f]{6}$")


def new_fleet_id() -> str:
    return secrets.token_hex(3)


def check_label(label: str) -> str:
    if not LABEL_RE.match(label):
        raise UsageError(f"bad label {label!r}: use 1-63 lowercase letters, digits and '-'")
    return label


_FIELDS = {f.name for f in fields(Row)}


def _row(where: str, d: Any) -> Row:
    if not isinstance(d, dict):
        raise RegistryError(f"{where}: expected an object")
    unknown = set(d) - _FIELDS
    if unknown:
        raise RegistryError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    try:
        return Row(**d)  # its status read as a BoxStatus
    except TypeError as e:
        raise RegistryError(f"{where}: {e}") from None


# each stored document's row, parsed once: a tick reads the registry some twenty times, and a
# row's document is its whole text, so an equal text is an equal row; every reader gets a copy
# (with whether its values are all immutable, so that a shallow copy shares them safely)
_PARSED: dict[str, tuple[Row, bool]] = {}
_PARSED_MAX = 200_000

# values that readers may share: immutable
_SHARED = {str, int, float, bool, type(None), BoxStatus}


def _parse(label: str, doc: str) -> Row:
    return _copy(_parsed(label, doc))


def _parsed(label: str, doc: str) -> tuple[Row, bool]:
    """The row `doc` holds (shared: never handed out, `_copy` it), and whether its values are
    all immutable."""
    seen = _PARSED.get(doc)
    if seen is None:
        try:
            d = json.loads(doc)
        except json.JSONDecodeError as e:
            raise RegistryError(f"registry row {label!r} is corrupt: {e.msg}; nothing was "
                                "changed") from None
        r = _row(f"registry row {label!r}", d)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        seen = _PARSED[doc] = (r, _SHARED.issuperset(map(type, vars(r).values())))
    return seen


def _copy(parsed: tuple[Row, bool]) -> Row:
    """A row no other reader holds."""
    r, shallow = parsed
    if not shallow:  # a list or object some hand-made document put there: its own copy
        return copy.deepcopy(r)
    out = object.__new__(Row)
    out.__dict__.update(r.__dict__)
    return out


def encode(r: Row) -> str:
    """The row's document: its fields, which are str, int, float, bool or None (a row's
    `vars` is its `to_dict` without asdict's deep copy)."""
    return json.dumps(vars(r), separators=(",", ":"))


def columns(r: Row) -> tuple[Any, ...]:
    """The columns the schema's indexes read, then the document."""
    return (r.provider, r.provider_id, r.slot, r.rerent_of, r.move_of, 1 if r.live else 0,
            encode(r))


def put(tx: Tx, r: Row, seq: int | None) -> None:
    """Write `r` within `tx`: a new row at `seq`, or (None) the row of its label changed."""
    if seq is None:
        tx.q("UPDATE boxes SET provider = ?, provider_id = ?, slot = ?, rerent_of = ?, "
             "move_of = ?, live = ?, doc = ? WHERE label = ?", (*columns(r), r.label))
    else:
        tx.q("INSERT INTO boxes (provider, provider_id, slot, rerent_of, move_of, live, doc, "
             "label, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (*columns(r), r.label, seq))


def _next_seq(tx: Tx) -> int:
    row = tx.one("SELECT MAX(seq) FROM boxes")
    return int(row[0]) + 1 if row and row[0] is not None else 1


class Registry:
    def __init__(self, path: Path, fence: Fence | None = None, db: Database | None = None
                 ) -> None:
        self.path = path  # the fleet's registry path: its state folder, its database's key
        self.db = db or open_db(path)
        self.fence = fence

    def fenced(self, fence: Fence | None) -> Registry:
        """This registry for a leader holding `fence`: its rents and destroys check it."""
        return Registry(self.path, fence, self.db)

    def _all(self, tx: Tx) -> dict[str, Row]:
        """Every row, in order: read again only when something was written since (a tick
        reads the registry some twenty times), each reader getting rows of its own."""
        seen = self.db.seen(tx)
        here = self.db.thread_local()  # `seen` is this thread's connection's
        cached = getattr(here, "registry_rows", None)
        if seen is None or cached is None or cached[0] != seen:
            cached = (seen, [(label, _parsed(label, doc)) for label, doc in
                             tx.q("SELECT label, doc FROM boxes ORDER BY seq")])
            here.registry_rows = cached if seen is not None else None
        return {label: _copy(parsed) for label, parsed in cached[1]}

    def _check_fence(self, tx: Tx) -> None:
        if self.fence is not None:
            self.fence.check(tx)

    def rows(self) -> list[Row]:
        """A consistent snapshot, in the order the rows were added."""
        with self.db.read() as tx:
            return list(self._all(tx).values())

    def live_rows(self) -> list[Row]:
        with self.db.read() as tx:
            return [_parse(label, doc) for label, doc in
                    tx.q("SELECT label, doc FROM boxes WHERE live = 1 ORDER BY seq")]

    def get(self, label: str) -> Row | None:
        with self.db.read() as tx:
            found = tx.one("SELECT doc FROM boxes WHERE label = ?", (label,))
        return None if found is None else _parse(label, found[0])

    @contextlib.contextmanager
    def transaction(self) -> Iterator[dict[str, Row]]:
        """Read every row, let the caller change them, write what changed at the end: one
        write transaction. A row taken out of the dict is deleted."""
        with self._rows_tx() as (_, rows):
            yield rows

    @contextlib.contextmanager
    def _rows_tx(self) -> Iterator[tuple[Tx, dict[str, Row]]]:
        with self.db.write() as tx:
            self._check_fence(tx)
            rows = self._all(tx)
            before = {label: encode(r) for label, r in rows.items()}
            yield tx, rows
            self._store(tx, before, rows)

    def _store(self, tx: Tx, before: dict[str, str], rows: dict[str, Row]) -> None:
        for label in before.keys() - rows.keys():
            tx.q("DELETE FROM boxes WHERE label = ?", (label,))
        seq = None
        for label, r in rows.items():
            if r.label != label:
                raise RegistryError(f"registry: row {r.label!r} stored under {label!r}")
            old = before.get(label)
            if old is None:
                seq = _next_seq(tx) if seq is None else seq + 1
                put(tx, r, seq)
            elif encode(r) != old:
                put(tx, r, None)

    def fleet_id(self) -> str:
        """This registry's fleet id, made and written on first use: every label the fleet
        makes carries it (`fleet.core.labels`), so a box is provably this fleet's only by its
        label's exact form, never by a role's prefix that a person's box or another
        registry's could share."""
        stored = self.stored_fleet_id()
        if stored is not None:
            return stored
        with self.db.write() as tx:
            found = tx.one("SELECT value FROM meta WHERE key = 'fleet_id'")
            if found is not None:
                return str(found[0])
            fid = new_fleet_id()
            tx.q("INSERT INTO meta (key, value) VALUES ('fleet_id', ?)", (fid,))
            return fid

    def stored_fleet_id(self) -> str | None:
        """The fleet id this registry holds, None before its first use (none is made)."""
        with self.db.read() as tx:
            found = tx.one("SELECT value FROM meta WHERE key = 'fleet_id'")
        return None if found is None else str(found[0])

    def set_fleet_id(self, tx: Tx, fid: str) -> None:
        """Record `fid` as the fleet's id (`fleet state import`): refused where another is."""
        if not FLEET_ID_RE.match(fid):
            raise RegistryError(f"fleet id {fid!r} is not 6 hex digits")
        found = tx.one("SELECT value FROM meta WHERE key = 'fleet_id'")
        if found is not None and found[0] != fid:
            raise RegistryError(f"the database's fleet id is {found[0]}, not {fid}")
        if found is None:
            tx.q("INSERT INTO meta (key, value) VALUES ('fleet_id', ?)", (fid,))

    def add(self, row: Row, check: Callable[[list[Row]], None] | None = None, *,
            resume: bool = False) -> Row:
        """Add `row`: the label's check, `check` and the write are one write transaction.

        + check: called in it with every row as it stands (the budget guard); if it raises,
          nothing is written, so two concurrent adds can never both pass it
        + resume: the label may hold an unfinished row (see `unfinished`), which `row`
          replaces, keeping its rerent_of (what the first attempt was for); its created_at is
          the new create's, from which the loop's deadline for it runs (a resume rents anew
          only where the first attempt left no box, which billed nothing)
        + the row's slot, replacement and move are refused by the database when another live
          row holds them (`fleet.state.schema`): one line, nothing written

        Example: `reg.add(row, check=budget.guard(cfg.daily_budget_usd, 0.4, "renting"))`
        """
        check_label(row.label)
        if not row.created_at:
            row.created_at = now_iso()
        try:
            with self.db.write() as tx:
                self._check_fence(tx)
                rows = self._all(tx)  # every row read: a corrupt one stops the write too
                old = rows.get(row.label)
                if old is not None and not (resume and unfinished(old)):
                    raise UsageError(f"label {row.label!r} is already in the registry")
                if check is not None:
                    check(list(rows.values()))
                if old is not None:
                    row.rerent_of = row.rerent_of or old.rerent_of
                    row.slot = row.slot or old.slot
                put(tx, row, None if old is not None else _next_seq(tx))
        except Duplicate as e:
            raise UsageError(f"{row.label}: not rented: {_taken(row)} ({e})") from None
        return row

    def check_fence(self) -> None:
        """Raise NotLeader unless this registry's fence still leads (a destroy asks this in
        its own transaction just before it calls the provider)."""
        if self.fence is not None:
            with self.db.write() as tx:
                self._check_fence(tx)

    def update(self, label: str, **changes: Any) -> Row:
        with self.db.write() as tx:
            return self._update(tx, label, changes)

    def _update(self, tx: Tx, label: str, changes: dict[str, Any]) -> Row:
        self._check_fence(tx)
        bad = set(changes) - _FIELDS
        if bad:
            raise RegistryError(f"no registry field {sorted(bad)[0]!r}")
        found = tx.one("SELECT doc FROM boxes WHERE label = ?", (label,))
        if found is None:
            raise UsageError(f"no box labelled {label!r} in the registry")
        row = _parse(label, found[0])
        for k, v in changes.items():
            setattr(row, k, BoxStatus.read(v) if k == "status" and isinstance(v, str) else v)
        try:
            put(tx, row, None)
        except Duplicate as e:
            raise UsageError(f"{label}: not changed: {_taken(row)} ({e})") from None
        return row

    def update_many(self, changes: dict[str, dict[str, Any]]) -> list[Row]:
        """`update` of many rows in one transaction (label -> its changes): a remap of every
        box's port is one commit, not one per box."""
        with self.db.write() as tx:
            return [self._update(tx, label, change) for label, change in changes.items()]

    def mark_destroyed(self, label: str, status: BoxStatus = BoxStatus.DESTROYED) -> Row:
        with self.db.write() as tx:
            self._check_fence(tx)
            return self._update(tx, label, {"status": status, "destroyed_at": now_iso()})


def _taken(row: Row) -> str:
    if row.slot:
        return f"slot {row.slot} already holds a live box"
    if row.rerent_of:
        return f"{row.rerent_of} already has a live replacement"
    if row.move_of:
        return f"{row.move_of} is already being moved"
    return f"{row.provider} box {row.provider_id} already has a row"
