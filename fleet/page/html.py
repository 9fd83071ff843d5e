"""The page's HTML and its files: `render` fills `templates/index.html.j2` (with `page.css`
inline) from the page's data; `write` puts `index.html` and `fleet.json` in place, each by
temporary file and rename, so a reader never sees half a page."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from fleet.core.errors import UsageError
from fleet.core.fileutil import write_atomic
from fleet.core.times import read_iso, utc_day
from fleet.core.verdicts import VERDICTS
from fleet.page.chart import CHART_DAYS, chart_svg, day_label
from fleet.page.compiled import CompiledTemplates
from fleet.page.words import age_words, day_time

FILES = ("index.html", "fleet.json")

UNKNOWN = Markup('<span class="unk">unknown</span>')


def _usd(v: float | None, digits: int = 2) -> str:
    return UNKNOWN if v is None else f"${v:,.{digits}f}"


def _yes(v: bool | None) -> str:
    return UNKNOWN if v is None else ("yes" if v else "no")


def _time(ts: str | None) -> str:
    t = read_iso(ts)
    return "—" if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")


def _short_time(ts: str | None) -> str:
    t = read_iso(ts)
    return "—" if t is None else f"{day_label(t)} {t:%H:%M} UTC"


def _clock(ts: str | None, today: str | None = None) -> str:
    """HH:MM on the page's own UTC day, with the day before it on any other."""
    t, ref = read_iso(ts), read_iso(today)
    if t is None:
        return "—"
    return f"{t:%H:%M}" if ref and utc_day(ref) == utc_day(t) else f"{day_label(t)} {t:%H:%M}"


def _num(v: float | int | None, digits: int = 1) -> str:
    if v is None:
        return UNKNOWN
    return f"{v:,}" if isinstance(v, int) else f"{v:,.{digits}f}"


_ICON = {"well": "✓", "problem": "!", "down": "✕", "unknown": "?", "owed": "…"}

_DICT_ATTRS = frozenset(dir(dict))


class _Env(Environment):
    """Jinja's environment, with `x.name` read straight from a plain dict's entry where `name`
    is none of dict's own attributes: the same value Jinja gives, which tries the attribute
    first and only then the entry, and on a page of thousands of boxes (its data is all dicts)
    spends most of its time raising and catching the missing attribute."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute in obj and attribute not in _DICT_ATTRS:
            return obj[attribute]
        return super().getattr(obj, attribute)


_loader = PackageLoader("fleet.page", "templates")
_env = _Env(loader=_loader, autoescape=True, undefined=StrictUndefined,
            trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
            bytecode_cache=CompiledTemplates())
_env.filters.update(usd=_usd, yes=_yes, time=_time, short_time=_short_time, clock=_clock,
                    num=_num)
_env.globals.update(icon=_ICON)


@cache
def _css() -> Markup:
    """The stylesheet, inlined into the page's <style> (the CSP allows no other)."""
    return Markup(_loader.get_source(_env, "page.css")[0].strip())


_BOX_HEADERS = ("Label", "Role", "Card", "Provider", "Standing", "Up (h)", "USD/h", "Synced",
                "Blocks", "Release", "Last check", "Job (phase · age)", "Verdict")
_OWED_HEADERS = ("Role", "Provider", "Card", "GPUs", "Reason", "Owed since", "For (h)")
_NUMERIC = ("Up (h)", "USD/h", "Blocks", "GPUs", "For (h)")


def _pill(state: str, text: str, zero: bool = False) -> Markup:
    """A status as colour AND word: the state's colour, an icon and the text."""
    cls = f"status {state}{' zero' if zero else ''}"
    # escaped one by one: Markup.format runs string.Formatter in Python, a row at a time
    return Markup(f'<span class="{escape(cls)}"><span class="i" aria-hidden="true">'
                  f'{escape(_ICON[state])}</span>{escape(text)}</span>')


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _tick_words(tick: Mapping[str, Any]) -> str:
    """`tick 42 at 17:03 UTC, 12 min old`: a last tick as the page names it everywhere."""
    return f"tick {tick['number']} at {day_time(tick['at'])}, {age_words(tick['age_s'])}"


def _sources(d: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each part of the page and where it comes from, in words (the footer's list): live,
    the loop's last tick (with its time), the loop's memory or the cached bills."""
    src = d["sources"]
    tick = src["last_tick"]
    from_tick = (f"from the loop's last tick ({_tick_words(tick)}"
                 f"{'; STALE' if tick['stale'] else ''})" if tick else
                 "unknown: no key here and no loop tick on record")
    sv = src["standing_verdicts"]
    checked = f"checked now ({_time(d['checked_at'])})"
    standing = {"live": checked, "last_tick": from_tick, "unknown": from_tick,
                "mixed": f"{', '.join(sv['live_providers'])}: {checked}; "
                         f"{', '.join(sv['last_tick_providers'])}: {from_tick}"}[sv["from"]]
    owed = {"loop": "from the loop's memory (its latest tick)",
            "last_tick": from_tick, "unknown": from_tick}[src["owed"]["from"]]
    m = src["money"]
    if m["bills_at"] is None:
        money = "estimated from the registry's prices (no cached bills)"
    elif m["boxes_from_bills"] == 0:
        money = (f"estimated from the registry's prices (the cached bills of "
                 f"{day_time(m['bills_at'])} count for no box)")
    else:
        money = (f"{m['boxes_from_bills']} of {m['of']} boxes from the cached bills of "
                 f"{day_time(m['bills_at'])}")
        if m["boxes_from_bills"] < m["of"]:
            money += ", the rest estimated from their prices"
    return [("Registry", f"read now ({_time(src['registry']['at'])})"),
            ("Standing boxes' verdicts", standing),
            ("One-shot boxes' verdicts", "watched now"),
            ("Owed boxes", owed), ("Money today", money)]


_RELEASE_WORD = {"current": "current", "behind": "behind", "ahead": "ahead",
                 "other": "not the wanted one", "unknown": "unknown"}


def render(data: Mapping[str, Any]) -> str:
    """The page's HTML from its data: self-contained, no script, the same bytes for the same
    data."""
    money = data["money"]
    budget_usd = float(money["daily_budget_usd"])
    used = float(money["projected_day_usd"])
    bar = 100.0 if budget_usd <= 0 else min(100.0, max(0.0, 100 * used / budget_usd))
    return _env.get_template("index.html.j2").render(
        d=data, css=_css(), svg=Markup(chart_svg(data["chart"])),
        verdicts=VERDICTS, release_word=_RELEASE_WORD, days=CHART_DAYS, bar=f"{bar:.1f}",
        box_headers=_BOX_HEADERS, owed_headers=_OWED_HEADERS, numeric=_NUMERIC, pill=_pill,
        plural=_plural, sources=_sources(data), age=age_words)


# ---------------------------------------------------------------- writing

def prepare(out_dir: Path) -> Path:
    """Make sure the page can be written into `out_dir` (created if missing) before anything
    is gathered or written: a file in the way or a folder that refuses writes is a UsageError."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"page directory {out_dir}: a file is in the way") from None
    except OSError as e:
        raise UsageError(f"page directory {out_dir}: cannot create it: "
                         f"{e.strerror or e}") from None
    if not out_dir.is_dir():
        raise UsageError(f"page directory {out_dir}: a file is in the way")
    for name in FILES:
        p = out_dir / name
        if p.exists() and not p.is_file():
            raise UsageError(f"page directory {out_dir}: {name} is not a file")
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise UsageError(f"page directory {out_dir}: no permission to write there")
    return out_dir


def write(out_dir: Path, data: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write `fleet.json` and `index.html` into `out_dir`, each by temp file and rename."""
    out_dir = prepare(out_dir)
    html = render(data)
    # compact: indenting would take the pure-Python encoder, seconds at 10,000 boxes
    doc = json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n"
    paths = (out_dir / "fleet.json", out_dir / "index.html")
    try:
        write_atomic(paths[0], doc)
        write_atomic(paths[1], html)
    except OSError as e:
        raise UsageError(f"page directory {out_dir}: cannot write: {e.strerror or e}") from None
    return paths
