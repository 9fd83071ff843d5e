"""The box registry (boxes.json): one row per box ever rented.

Rows are never deleted: a destroyed box keeps its row, marked with `destroyed_at`, so the history
of what was paid for survives. Every change happens under a cross-process lock and lands with an
atomic rename, so a writer killed mid-update loses nothing. A file that does not parse stops the
program with the place where it is broken; it is never silently reset.
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
from typing import Any

from fleet.core.boxes import Row, unfinished
from fleet.core.errors import RegistryError, UsageError
from fleet.core.fileutil import locked, write_atomic
from fleet.core.times import now_iso

SCHEMA = 1
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
        return Row(**d)
    except TypeError as e:
        raise RegistryError(f"{where}: {e}") from None


# the last text read at each registry path, with its fleet id and rows: a re-read of an
# unchanged file (a loop tick reads the registry some twenty times) compares the text instead
# of parsing it again. Exact, as the key is the file's whole text, never its stat, and every
# reader gets rows of its own to change
_PARSED: dict[Path, tuple[str, str | None, dict[str, Row]]] = {}
_PARSED_PATHS = 16  # more registries than this in one process (tests): start again


_SHARED = {str, int, float, bool, type(None)}  # values that readers may share: immutable


def _copy(r: Row) -> Row:
    """A row no other reader holds: its fields are str, int, float, bool or None, which a
    shallow copy shares safely (anything else a hand-edited file put there is copied too)."""
    if _SHARED.issuperset(map(type, vars(r).values())):
        return copy.copy(r)
    return copy.deepcopy(r)


def _copies(rows: dict[str, Row]) -> dict[str, Row]:
    return {label: _copy(r) for label, r in rows.items()}


class Registry:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")

    def _read(self) -> dict[str, Row]:
        return self._read_doc()[1]

    def _read_doc(self) -> tuple[str | None, dict[str, Row]]:
        """The fleet id (None before the first write) and the rows, by label."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None, {}
        except (OSError, UnicodeDecodeError) as e:
            raise RegistryError(f"registry {self.path}: cannot read: {e}") from None
        seen = _PARSED.get(self.path)
        if seen is not None and seen[0] == text:
            return seen[1], _copies(seen[2])
        fid, out = self._parse(text)
        if len(_PARSED) >= _PARSED_PATHS and self.path not in _PARSED:
            _PARSED.clear()
        _PARSED[self.path] = (text, fid, _copies(out))
        return fid, out

    def _parse(self, text: str) -> tuple[str | None, dict[str, Row]]:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise RegistryError(
                f"registry {self.path} is corrupt at line {e.lineno} column {e.colno}: {e.msg}; "
                "restore it from a backup (nothing was changed)") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise RegistryError(
                f"registry {self.path}: expected schema {SCHEMA}, found "
                f"{doc.get('schema') if isinstance(doc, dict) else type(doc).__name__!r}")
        rows = doc.get("boxes")
        if not isinstance(rows, list):
            raise RegistryError(f"registry {self.path}: 'boxes' is not a list")
        fid = doc.get("fleet_id")
        if fid is not None and not (isinstance(fid, str) and FLEET_ID_RE.match(fid)):
            raise RegistryError(f"registry {self.path}: fleet_id {fid!r} is not 6 hex digits")
        out: dict[str, Row] = {}
        for i, d in enumerate(rows):
            r = _row(f"registry {self.path}: boxes[{i}]", d)
            if r.label in out:
                raise RegistryError(
                    f"registry {self.path}: boxes[{i}]: duplicate label {r.label!r}")
            out[r.label] = r
        return fid, out

    def _write(self, fid: str, rows: dict[str, Row]) -> None:
        doc = {"schema": SCHEMA, "fleet_id": fid, "updated_at": now_iso(),
               "boxes": [r.to_dict() for r in rows.values()]}
        write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=False) + "\n")

    def rows(self) -> list[Row]:
        """A consistent snapshot (readers take the lock too, so they never see a half-state)."""
        with locked(self.lock_path):
            return list(self._read().values())

    def live_rows(self) -> list[Row]:
        return [r for r in self.rows() if r.live]

    def get(self, label: str) -> Row | None:
        with locked(self.lock_path):
            return self._read().get(label)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[dict[str, Row]]:
        """Lock, read, let the caller change the rows, write once at the end."""
        with locked(self.lock_path):
            fid, rows = self._read_doc()
            yield rows
            self._write(fid or new_fleet_id(), rows)

    def fleet_id(self) -> str:
        """This registry's fleet id, made and written on first use: every label the fleet
        makes carries it (`fleet.core.labels`), so a box is provably this fleet's only by its
        label's exact form, never by a role's prefix that a person's box or another
        registry's could share."""
        with locked(self.lock_path):
            fid, rows = self._read_doc()
            if fid is None:
                fid = new_fleet_id()
                self._write(fid, rows)
            return fid

    def add(self, row: Row, check: Callable[[list[Row]], None] | None = None, *,
            resume: bool = False) -> Row:
        """Add `row`: the label's check, `check` and the write are one locked step.

        + check: called under the lock with every row as it stands (the budget guard); if it
          raises, nothing is written, so two concurrent adds can never both pass it
        + resume: the label may hold an unfinished row (see `unfinished`), which `row`
          replaces, keeping its rerent_of (what the first attempt was for); its created_at is
          the new create's, from which the loop's deadline for it runs (a resume rents anew
          only where the first attempt left no box, which billed nothing)

        Example: `reg.add(row, check=budget.guard(cfg.daily_budget_usd, 0.4, "renting"))`
        """
        check_label(row.label)
        if not row.created_at:
            row.created_at = now_iso()
        with self.transaction() as rows:
            old = rows.get(row.label)
            if old is not None and not (resume and unfinished(old)):
                raise UsageError(f"label {row.label!r} is already in the registry")
            if check is not None:
                check(list(rows.values()))
            if old is not None:
                row.rerent_of = row.rerent_of or old.rerent_of
            rows[row.label] = row
        return row

    def update(self, label: str, **changes: Any) -> Row:
        bad = set(changes) - _FIELDS
        if bad:
            raise RegistryError(f"no registry field {sorted(bad)[0]!r}")
        with self.transaction() as rows:
            row = rows.get(label)
            if row is None:
                raise UsageError(f"no box labelled {label!r} in the registry")
            for k, v in changes.items():
                setattr(row, k, v)
        return row

    def mark_destroyed(self, label: str, status: str = "destroyed") -> Row:
        return self.update(label, status=status, destroyed_at=now_iso())
