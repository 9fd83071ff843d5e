"""`fleet state import`: the JSON state files of an older fleet moved into the state database.

The files (beside the old registry path: `boxes.json`, `loop.json`, `bills.json`,
`last_tick.json`, `check-history.json`) are read, never changed or removed. Everything goes in
as one write transaction, so an import that fails (a file that does not parse or is not a
regular file, a row the schema refuses) leaves the database as it was; each row is then read
back and compared with its file's, field by field. A database that already holds rows or
documents takes the import only where they are exactly the files' (a second import changes
nothing); otherwise it is refused: what the fleet changed since is never put back.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fleet.core.boxes import Row
from fleet.core.errors import FleetError, RegistryError, UsageError
from fleet.core.times import now_iso
from fleet.state import docs
from fleet.state.db import Database, Duplicate, Tx
from fleet.state.registry import FLEET_ID_RE, Registry, _row, encode, put

FILES = ("boxes.json", "loop.json", "bills.json", "last_tick.json", "check-history.json")


@dataclass
class Imported:
    rows: int = 0
    already: int = 0  # rows the database held, equal to the files'
    memory: bool = False
    bills: bool = False
    tick_boxes: int | None = None  # None: no last tick
    history: int = 0
    fleet_id: str | None = None


def _read(path: Path) -> Any | None:
    try:  # never blocks on a FIFO: a file that is not a regular one is refused below
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e}; nothing imported") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(f"{path}: not a regular file; nothing imported")
        data = f.read()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: cannot read: {e}; nothing imported") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is corrupt at line {e.lineno} column {e.colno}: {e.msg}; "
                         "nothing imported") from None
    except RecursionError:
        raise UsageError(f"{path} is corrupt: nested too deep; nothing imported") from None


def rows_of(path: Path, doc: Any) -> tuple[str | None, list[Row]]:
    """The fleet id and rows of a `boxes.json` document, every field checked."""
    if not isinstance(doc, dict) or doc.get("schema") != 1:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise UsageError(f"{path}: expected registry schema 1, found {found!r}; nothing imported")
    boxes = doc.get("boxes")
    if not isinstance(boxes, list):
        raise UsageError(f"{path}: 'boxes' is not a list; nothing imported")
    fid = doc.get("fleet_id")
    if fid is not None and not (isinstance(fid, str) and FLEET_ID_RE.match(fid)):
        raise UsageError(f"{path}: fleet_id {fid!r} is not 6 hex digits; nothing imported")
    out: list[Row] = []
    seen: set[str] = set()
    for i, d in enumerate(boxes):
        try:
            r = _row(f"{path}: boxes[{i}]", d)
        except RegistryError as e:
            raise UsageError(f"{e}; nothing imported") from None
        if r.label in seen:
            raise UsageError(f"{path}: boxes[{i}]: duplicate label {r.label!r}; nothing imported")
        seen.add(r.label)
        out.append(r)
    return fid, out


def import_files(folder: Path, db: Database, registry: Path) -> Imported:
    """Move the JSON state in `folder` into `db`, checked row by row (the module's docstring)."""
    found = {name: _read(folder / name) for name in FILES}
    if all(v is None for v in found.values()):
        raise UsageError(f"{folder}: none of {', '.join(FILES)} is there; nothing imported")
    fid, rows = (None, []) if found["boxes.json"] is None else rows_of(folder / "boxes.json",
                                                                      found["boxes.json"])
    out = Imported(fleet_id=fid)
    reg = Registry(registry, db=db)
    try:
        with db.write() as tx:
            if fid is not None:
                try:
                    reg.set_fleet_id(tx, fid)
                except RegistryError as e:
                    raise UsageError(f"{e}: another fleet's database; nothing imported") from None
            _rows(tx, rows, out)
            _documents(tx, folder, found, out)
            tx.q("INSERT INTO meta (key, value) VALUES ('imported_at', ?) ON CONFLICT (key) "
                 "DO NOTHING", (now_iso(),))
    except Duplicate as e:
        raise UsageError(f"{folder / 'boxes.json'}: {e}; nothing imported") from None
    _verify(reg, rows)
    return out


def _rows(tx: Tx, rows: list[Row], out: Imported) -> None:
    held = {label: doc for label, doc in tx.q("SELECT label, doc FROM boxes")}
    if held and set(held) != {r.label for r in rows}:
        raise UsageError(f"the database already holds {len(held)} other rows; nothing imported "
                         "(import into an empty database)")
    top = tx.one("SELECT MAX(seq) FROM boxes")
    seq = int(top[0]) if top and top[0] is not None else 0
    for r in rows:
        if r.label in held:
            if json.loads(held[r.label]) != json.loads(encode(r)):
                raise UsageError(f"{r.label}: the database's row differs from the file's; "
                                 "nothing imported")
            out.already += 1
            continue
        seq += 1
        put(tx, r, seq)
        out.rows += 1


def _documents(tx: Tx, folder: Path, found: dict[str, Any], out: Imported) -> None:
    """The files' documents, each where the database has none yet or the same: one the fleet
    changed since an earlier import is never put back (the import is refused)."""
    from fleet.state import last_tick
    from fleet.state.bills import NAME as BILLS
    from fleet.state.loop_memory import NAME as LOOP
    from fleet.state.loop_memory import Memory

    if found["loop.json"] is not None:
        try:
            mem = Memory.from_dict(found["loop.json"], str(folder / "loop.json"))
        except FleetError as e:
            raise UsageError(f"{e}; nothing imported") from None
        _document(tx, LOOP, asdict(mem), folder / "loop.json")
        out.memory = True
    if found["bills.json"] is not None:
        if not isinstance(found["bills.json"], dict) or "read_at" not in found["bills.json"]:
            raise UsageError(f"{folder / 'bills.json'}: not a bills document; nothing imported")
        _document(tx, BILLS, found["bills.json"], folder / "bills.json")
        out.bills = True
    tick = found["last_tick.json"]
    if tick is not None:
        try:
            read = last_tick._read(tick)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise UsageError(f"{folder / 'last_tick.json'}: not readable ({e}); nothing "
                             "imported") from None
        held = last_tick.load_in(tx)
        if held is None and tx.one("SELECT 1 FROM ticks") is None:
            last_tick.save_in(tx, read)
        elif held != read:
            raise _changed(folder / "last_tick.json", "last tick")
        out.tick_boxes = len(read.health)
    history = found["check-history.json"]
    if history is not None:
        if not isinstance(history, dict):
            raise UsageError(f"{folder / 'check-history.json'}: not an object; nothing imported")
        held_history = dict(tx.q("SELECT label, doc FROM check_history"))
        new = []
        for label, doc in history.items():
            if str(label) not in held_history:
                new.append((str(label), json.dumps(doc)))
            elif json.loads(held_history[str(label)]) != doc:
                raise _changed(folder / "check-history.json", f"check history of {label}")
        tx.many("INSERT INTO check_history (label, doc) VALUES (?, ?)", new)
        out.history = len(history)


def _document(tx: Tx, name: str, doc: Any, path: Path) -> None:
    held = tx.one("SELECT doc FROM docs WHERE name = ?", (name,))
    if held is None:
        docs.put_in(tx, name, doc)
    elif json.loads(held[0]) != json.loads(json.dumps(doc)):
        raise _changed(path, f"{name} document")


def _changed(path: Path, what: str) -> UsageError:
    return UsageError(f"{path}: the database's {what} differs from the file's (the fleet "
                      "changed it since an earlier import); nothing imported")


def _verify(reg: Registry, rows: list[Row]) -> None:
    """Every file row read back from the database, field by field."""
    stored = {r.label: r for r in reg.rows()}
    for r in rows:
        back = stored.get(r.label)
        if back is None or back.to_dict() != r.to_dict():
            raise RegistryError(f"{r.label}: read back from the database differs from the "
                                "file's row")
