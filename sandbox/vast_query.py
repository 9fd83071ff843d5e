"""Vast's search query language over row dicts: `{field: {op: value}}`, order, virtual columns.

The server, not the client, knows the column types, so values arrive loosely typed (the CLI
sends `"1"` for `num_gpus=1`) and are coerced to the row's type before comparing, as SQL would.
Virtual columns are rewritten as Vast's server does (`vastai/data/query.py` names them):
`driver_version` compares the integer `driver_vers` (535.86.05 -> 535086005), `geolocation` the
trailing country code, `datacenter` the hosting type, `verified` the verification.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

from sandbox.catalog import driver_number


class QueryError(ValueError):
    """A query the server refuses (unknown field or operator, uncomparable value)."""


def _in(have: Any, want: Any) -> bool:
    return have in want


OPS: dict[str, Callable[[Any, Any], bool]] = {
    "eq": operator.eq, "neq": operator.ne, "gt": operator.gt, "gte": operator.ge,
    "lt": operator.lt, "lte": operator.le,
    "in": _in, "notin": lambda have, want: not _in(have, want),
}


def _driver(value: Any) -> int:
    text = str(value)
    return driver_number(text) if "." in text else int(float(text))


# virtual column -> (how to read the row, how to read the wanted value)
VIRTUAL: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[[Any], Any] | None]] = {
    "driver_version": (lambda r: r["driver_vers"], _driver),
    "geolocation": (lambda r: (r.get("geolocation") or "").strip()[-2:], str),
    "datacenter": (lambda r: r.get("hosting_type") == 1, None),
    "verified": (lambda r: r.get("verification") == "verified", None),
    "ubuntu_version": (lambda r: r.get("os_version"), str),
    "cuda_vers": (lambda r: r.get("cuda_max_good"), None),
    "reliability2": (lambda r: r.get("reliability2", r.get("reliability")), None),
}


def coerce(want: Any, have: Any) -> Any:
    """`want` in the type of the row's value `have` (lists element-wise)."""
    if isinstance(want, list):
        return [coerce(w, have) for w in want]
    if want is None or have is None:
        return want
    try:
        if isinstance(have, bool):
            return want if isinstance(want, bool) else str(want).lower() in ("true", "1")
        if isinstance(have, int | float):
            return float(want)
        return str(want)
    except ValueError as exc:
        raise QueryError(f"cannot compare {want!r} with {have!r}") from exc


def matches(row: dict[str, Any], filters: dict[str, Any]) -> bool:
    for name, cond in filters.items():
        conds = cond if isinstance(cond, dict) else {"eq": cond}
        read, convert = VIRTUAL.get(name, (_column(name), None))
        have = read(row)
        for op, want in conds.items():
            if op not in OPS:
                raise QueryError(f"unknown operator {op!r} for {name}")
            if convert is not None and want is not None:
                want = [convert(w) for w in want] if isinstance(want, list) else convert(want)
            want = coerce(want, have)
            if have is None and op not in ("eq", "neq", "in", "notin"):
                return False
            if not OPS[op](have, want):
                return False
    return True


def _column(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda row: row.get(name)


def check_fields(filters: dict[str, Any], known: AbstractSet[str], what: str) -> None:
    for name in filters:
        if name not in known and name not in VIRTUAL:
            raise QueryError(f"{name} is not a valid search key for {what}")


def parse_order(order: Any) -> list[tuple[str, bool]]:
    """`[[col, "asc"|"desc"], ...]` or `[{"col":..,"dir":..}, ...]` as [(col, descending)]."""
    keys: list[tuple[str, bool]] = []
    for item in order or []:
        col, direction = (item.get("col"), item.get("dir", "asc")) if isinstance(item, dict) \
            else (item[0], item[1] if len(item) > 1 else "asc")
        keys.append((str(col), str(direction).lower() == "desc"))
    return keys


def order_rows(rows: list[dict[str, Any]], order: Any) -> list[dict[str, Any]]:
    """Sort by `[[col, "asc"|"desc"], ...]` or `[{"col":..,"dir":..}, ...]`, id breaking ties."""
    keys = parse_order(order)
    out = sorted(rows, key=lambda r: r.get("id", 0))
    for col, desc in reversed(keys):  # stable sorts, least significant key first
        out.sort(key=_sort_key(col), reverse=desc)
    return out


def _sort_key(col: str) -> Callable[[dict[str, Any]], tuple[bool, Any]]:
    def key(row: dict[str, Any]) -> tuple[bool, Any]:
        return _value_key(row.get(col))

    return key


def _value_key(value: Any) -> tuple[bool, Any]:
    return (value is None, 0 if value is None else value)  # missing values sort last


# -- keyset paging ------------------------------------------------------------------------------
# A listing in `order` is a sequence ordered by the columns of `keyset(order)`, compared one after
# the other as `order_rows` sorts them (missing values last, each column in its own direction),
# the unique `id` deciding last. A page's cursor is the last row's values of those columns; the
# next page starts at the first row that comes after it, so rows added or removed between pages
# move no other row, as Vast's keyset paging by `after_token` behaves.


def keyset(order: Any) -> list[tuple[str, bool]]:
    """The columns that position a row in `order`: `order` up to its first `id` (ids are
    unique: later columns never decide), else `order` then `id` ascending (`order_rows`'s
    tiebreaker)."""
    keys = parse_order(order)
    for n, (col, _) in enumerate(keys):
        if col == "id":
            return keys[: n + 1]
    return [*keys, ("id", False)]


def row_position(row: dict[str, Any], keys: list[tuple[str, bool]]) -> list[Any]:
    """The row's values of the `keyset` columns: what a cursor after this row holds."""
    return [row.get(col) for col, _ in keys]


def comes_after(values: list[Any], cursor: list[Any], keys: list[tuple[str, bool]]) -> bool:
    """Whether a row with `values` (its `row_position`) sorts after the `cursor` in the listing.
    Raises QueryError when a cursor value cannot be compared with the row's."""
    try:
        for (_, desc), have, mark in zip(keys, values, cursor, strict=True):
            a, b = _value_key(have), _value_key(mark)
            if a < b:
                return desc
            if b < a:
                return not desc
    except TypeError as exc:
        raise QueryError("invalid after_token") from exc
    return False


def first_after(rows: list[dict[str, Any]], keys: list[tuple[str, bool]],
                cursor: list[Any]) -> int:
    """The index of the first of `rows` (sorted by `order_rows`) after `cursor`: a binary
    search, since "comes after" holds for a suffix of the sorted rows."""
    lo, hi = 0, len(rows)
    while lo < hi:
        mid = (lo + hi) // 2
        if comes_after(row_position(rows[mid], keys), cursor, keys):
            hi = mid
        else:
            lo = mid + 1
    return lo
