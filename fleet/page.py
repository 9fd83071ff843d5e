"""The fleet page: one static HTML file and its JSON, both built from an allow-list of fields.

`build` turns the registry's rows, `fleet check`'s verdicts and the meter watchdog's into the
page's data (the `fleet.json` document); `render` turns that data into `index.html`; `write`
puts both in place, each by temporary file and rename, so a reader never sees half a page.

The page needs no JavaScript and makes no request of its own: its CSS is inline, its chart is an
SVG step line drawn here, and a Content-Security-Policy forbids anything else. It never carries a
key, an SSH endpoint, an IP address or a host key: the data is assembled field by field from the
rows (never by copying a row), and every free text (problems, refusals, reasons) is scrubbed of
the registry's endpoints and of anything that reads as an address or a key.

Example:

    data = page.build(cfg, reg.rows(), health, watched, datetime.now(UTC))
    page.write(Path("state/page"), data)
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from jinja2 import Environment, StrictUndefined
from markupsafe import Markup

from fleet import budget
from fleet.check import Health
from fleet.config import Config
from fleet.errors import UsageError
from fleet.fileutil import write_atomic
from fleet.registry import Row
from fleet.watchdog import Watch

SCHEMA = 1
FILES = ("index.html", "fleet.json")
RULE = ("Standing boxes stay up, are never destroyed when a job ends, and are replaced in the "
        "same shape when their host dies.")
# worst first: the order of the rows and of the summary
VERDICTS = ("down", "problem", "unknown", "well")
CHART_DAYS = 7


@dataclass(frozen=True)
class Owed:
    """A wanted box no provider can give yet (filled in by the loop; the page only shows it)."""

    role: str
    provider: str
    card: str
    gpus: int
    reason: str
    since: str  # UTC ISO-8601

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "provider": self.provider, "card": self.card,
                "gpus": self.gpus, "reason": self.reason, "since": self.since}


# ---------------------------------------------------------------- times and free text

def iso(t: datetime) -> str:
    return t.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _parse(ts: str | None) -> datetime | None:
    if not ts:
        return None
    try:
        t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
_IPV6 = re.compile(r"(?<![\w:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])")
_KEYS = re.compile(r"\b(?:ssh-(?:ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+)\s+[A-Za-z0-9+/=]{16,}"
                   r"|\bhf_[A-Za-z0-9]{16,}|-----BEGIN [A-Z ]+-----")
_ENV_SECRETS = ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN")


class Scrubber:
    """Removes what must never be published from free text: the registry's SSH endpoints, IP
    addresses and host keys (known values first), then anything that reads as an IP address or
    a key, then the values of the key variables of the environment."""

    def __init__(self, rows: Iterable[Row]) -> None:
        known: set[str] = set()
        for r in rows:
            if r.ssh_host and r.ssh_port:
                known.add(f"{r.ssh_host}:{r.ssh_port}")
            for v in (r.ssh_host, r.public_ip, r.host_key):
                if v:
                    known.add(v)
            if r.host_key and len(r.host_key.split()) > 1:
                known.add(r.host_key.split()[1])
        known.update(v for k in _ENV_SECRETS if len(v := os.environ.get(k, "")) >= 8)
        # longest first, so "host:port" goes before "host"
        self.known = sorted(known, key=lambda s: (-len(s), s))

    def __call__(self, text: str) -> str:
        for v in self.known:
            text = text.replace(v, "[redacted]")
        text = _KEYS.sub("[redacted key]", text)
        text = _IPV4.sub(lambda m: _address(m.group(0)), text)
        return _IPV6.sub(lambda m: _address(m.group(0)), text)


def _address(token: str) -> str:
    try:
        ipaddress.ip_address(token)
    except ValueError:
        return token
    return "[address]"


# ---------------------------------------------------------------- the data

def is_standing(cfg: Config, row: Row) -> bool:
    """A box of a standing role, converted or not (the rule `fleet destroy` uses)."""
    role = cfg.roles.get(row.role)
    return row.standing or row.kind == "standing" or (role is not None
                                                      and role.kind == "standing")


def build(cfg: Config, rows: Sequence[Row], health: Sequence[Health], watched: Sequence[Watch],
          now: datetime, history: Sequence[Row] | None = None, *,
          owed: Sequence[Owed | Mapping[str, Any]] = (), checked_at: datetime | None = None,
          check_error: str | None = None, interval_s: float | None = None,
          billed: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The page's data (the `fleet.json` document), from explicit fields only.

    + rows: the registry's rows (destroyed ones too): live ones are listed, all count for money
    + health: `fleet.check.check`'s verdicts on the standing boxes
    + watched: `fleet.watchdog.watch`'s verdicts on the one-shot boxes
    + now: the time the page describes (UTC)
    + history: the rows the USD/h chart is drawn from (default: `rows`)
    + owed: wanted boxes no provider can give yet, with their reasons
    + checked_at: when `health` and `watched` were read (default: `now`)
    + check_error: why the standing boxes could not be checked (their verdict is unknown)
    + interval_s: how often the page is rewritten (the loop's tick), when it is
    + billed: spent today by label from the providers' bills (`fleet.bills.billed`); other
      rows are estimated from their price

    Example: `build(cfg, reg.rows(), check(cfg, built), watch(cfg, reg), datetime.now(UTC))`
    """
    now = now.astimezone(UTC)
    scrub = Scrubber([*rows, *(history or ())])
    checked = iso(checked_at or now)
    by_health = {h.label: h for h in health}
    by_watch = {w.label: w for w in watched}
    boxes = []
    for r in rows:
        if not r.live:
            continue
        standing = is_standing(cfg, r)
        if standing or r.kind != "oneshot":
            boxes.append(_standing_box(r, standing, by_health.get(r.label), checked,
                                       check_error, now, scrub))
        else:
            boxes.append(_oneshot_box(r, by_watch.get(r.label), checked, now, scrub))
    boxes.sort(key=lambda b: (VERDICTS.index(b["verdict"]), b["label"]))

    live_h = sum(b["usd_per_hour"] for b in boxes)
    standing_boxes = [b for b in boxes if b["standing"]]
    standing_h = sum(b["usd_per_hour"] for b in standing_boxes)
    wanted: dict[str, int] = {}
    for w in cfg.roster:
        wanted[w.role] = wanted.get(w.role, 0) + w.count
    have: dict[str, int] = {}
    for b in standing_boxes:
        have[b["role"]] = have.get(b["role"], 0) + 1
    roles = [{"role": name, "boxes": have.get(name, 0), "wanted": wanted.get(name)}
             for name in sorted(set(have) | {n for n in wanted
                                             if cfg.roles.get(n) and
                                             cfg.roles[n].kind == "standing"})]
    p = budget.project(list(rows), cfg.daily_budget_usd, now=now, billed=billed)
    today = [r for r in rows if r.status != "failed" and (r.destroyed_at is None or
                                                          r.destroyed_at >= iso(now)[:10])]
    from_bills = sum(1 for r in today if r.label in (billed or {}))
    owed_rows = sorted((_owed(o, now, scrub) for o in owed),
                       key=lambda o: (o["since"] or "", o["role"], o["provider"], o["card"]))
    return {
        "schema": SCHEMA,
        "generated_at": iso(now),
        "checked_at": checked,
        "interval_s": interval_s,
        "check_error": scrub(check_error) if check_error else None,
        "standing": {
            "count": len(standing_boxes),
            "usd_per_hour": round(standing_h, 6),
            "usd_per_day": round(standing_h * 24, 6),
            "roles": roles,
            "rule": RULE,
        },
        "totals": {
            "boxes": len(boxes),
            "usd_per_hour": round(live_h, 6),
            "usd_per_day": round(live_h * 24, 6),
            "verdicts": {v: sum(1 for b in boxes if b["verdict"] == v) for v in VERDICTS},
            "owed": len(owed_rows),
        },
        "money": {
            "spent_today_usd": round(p.spent_usd, 6),
            # how many of today's boxes were counted from a bill; the rest are estimated
            "spent_from_bills": {"boxes": from_bills, "of": len(today)},
            "committed_until_midnight_usd": round(p.committed_usd, 6),
            "projected_day_usd": round(p.spent_usd + p.committed_usd, 6),
            "daily_budget_usd": p.budget_usd,
            "headroom_usd": round(p.budget_usd - p.spent_usd - p.committed_usd, 6),
            "fits": p.fits,
        },
        "boxes": boxes,
        "owed": owed_rows,
        "chart": chart_data(history if history is not None else rows, now),
    }


def _hours(since: str | None, now: datetime) -> float | None:
    t = _parse(since)
    return None if t is None else round(max(0.0, (now - t).total_seconds()) / 3600, 2)


def _common(r: Row, standing: bool, now: datetime) -> dict[str, Any]:
    # the allow-list: nothing else of a row ever reaches the page
    return {"label": r.label, "role": r.role, "kind": r.kind, "standing": standing,
            "card": r.card, "gpus": r.gpu_count, "provider": r.provider, "status": r.status,
            "uptime_h": _hours(r.created_at, now), "usd_per_hour": r.usd_per_hour}


def _standing_box(r: Row, standing: bool, h: Health | None, checked: str,
                  check_error: str | None, now: datetime, scrub: Scrubber) -> dict[str, Any]:
    box = _common(r, standing, now)
    if h is None:
        why = f"not checked: {check_error}" if check_error else "not checked"
        box.update(synced=None, blocks=None,
                   release={"running": None, "wanted": r.node_sha16_wanted, "state": "unknown"},
                   behind=None, checked_at=None, verdict="unknown", problems=[scrub(why)],
                   job=None)
        return box
    state = _release_state(h)
    if h.well:
        verdict = "well"
    elif not h.ssh or any(p.startswith("provider: ") for p in h.problems):
        verdict = "down"
    else:
        verdict = "problem"
    box.update(synced=h.synced, blocks=h.blocks,
               release={"running": h.node_sha16,
                        "wanted": h.wanted_sha16 or r.node_sha16_wanted, "state": state},
               behind={"current": False, "ahead": False, "behind": True, "other": True}.get(state),
               checked_at=checked, verdict=verdict, problems=[scrub(p) for p in h.problems],
               job=None)
    return box


def _release_state(h: Health) -> str:
    """current, behind, ahead, other (not the wanted one, order unknown) or unknown."""
    if not h.node_sha16 or not h.wanted_sha16:
        return "unknown"
    if h.node_sha16 == h.wanted_sha16:
        return "current"
    for p in h.problems:
        if p.startswith("node: behind"):
            return "behind"
        if p.startswith("node: ahead"):
            return "ahead"
    return "other"


def _oneshot_box(r: Row, w: Watch | None, checked: str, now: datetime,
                 scrub: Scrubber) -> dict[str, Any]:
    box = _common(r, False, now)
    created = _parse(r.created_at)
    expires = _parse(r.expires_at)
    age = round((now - created).total_seconds() / 60, 1) if created else None
    left = round((expires - now).total_seconds() / 60, 1) if expires else None
    phase = r.job_state
    problems: list[str] = []
    if w is None:
        verdict = "unknown"
        problems.append("not watched")
        at = None
    else:
        phase, at, age = w.phase, checked, round(w.age_min, 1)
        left = None if w.ttl_left_min is None else round(w.ttl_left_min, 1)
        problems = [scrub(p) for p in w.problems]
        verdict = "well" if w.well else "problem"
    if r.refusal:
        problems.append(scrub(f"refused: {r.refusal}; 0 invocations"))
    box.update(synced=None, blocks=None, release=None, behind=None, checked_at=at,
               verdict=verdict, problems=problems,
               job={"name": r.job, "phase": phase or ("staged" if r.job else None),
                    "age_min": age, "ttl_left_min": left})
    return box


def _owed(o: Owed | Mapping[str, Any], now: datetime, scrub: Scrubber) -> dict[str, Any]:
    d = o.to_dict() if isinstance(o, Owed) else dict(o)
    since = _parse(str(d.get("since") or ""))
    return {"role": str(d["role"]), "provider": str(d["provider"]), "card": str(d["card"]),
            "gpus": int(d["gpus"]), "reason": scrub(str(d["reason"])),
            "since": iso(since) if since else None,
            "owed_h": _hours(iso(since), now) if since else None}


# ---------------------------------------------------------------- the chart's data

def chart_data(rows: Iterable[Row], now: datetime, days: int = CHART_DAYS) -> dict[str, Any]:
    """The fleet's USD/h over the last `days` days: at any moment the sum of the prices of the
    rows live then (a failed rent never billed, as in the budget). `steps` holds the value at
    the window's start, then one entry per change; `days` holds each UTC day's peak and what it
    cost (today's equals the budget's spent today)."""
    start = now - timedelta(days=days)
    spans: list[tuple[datetime, datetime, float]] = []
    for r in rows:
        t0 = _parse(r.created_at)
        if t0 is None or r.status == "failed":
            continue
        t1 = _parse(r.destroyed_at)
        t1 = min(t1, now) if t1 else now
        if t1 > t0:
            spans.append((t0, t1, r.usd_per_hour))
    deltas: dict[datetime, float] = {}
    level = 0.0
    for t0, t1, usd in spans:
        if t0 <= start < t1:
            level += usd
        for t, d in ((t0, usd), (t1, -usd)):
            if start < t < now:
                deltas[t] = deltas.get(t, 0.0) + d
    steps = [{"at": iso(start), "usd_per_hour": _money(level)}]
    for t in sorted(deltas):
        if abs(deltas[t]) < 1e-9:
            continue
        level += deltas[t]
        steps.append({"at": iso(t), "usd_per_hour": _money(level)})
    day_rows = []
    day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    while day < now:
        lo, hi = max(day, start), min(day + timedelta(days=1), now)
        spent = sum(usd * (min(t1, hi) - max(t0, lo)).total_seconds() / 3600
                    for t0, t1, usd in spans if min(t1, hi) > max(t0, lo))
        day_rows.append({"day": day.date().isoformat(), "from": iso(lo), "to": iso(hi),
                         "peak_usd_per_hour": _peak(steps, lo, hi),
                         "spent_usd": round(spent, 6)})
        day += timedelta(days=1)
    return {"unit": "USD/h", "from": iso(start), "to": iso(now),
            "now_usd_per_hour": steps[-1]["usd_per_hour"], "steps": steps, "days": day_rows}


def _money(v: float) -> float:
    v = round(v, 6)
    return 0.0 if v == 0 else v  # no -0.0


def _peak(steps: Sequence[Mapping[str, Any]], lo: datetime, hi: datetime) -> float:
    """The highest USD/h between lo and hi: the step in force at lo and every change before hi."""
    best = 0.0
    for i, s in enumerate(steps):
        at = _parse(s["at"])
        assert at is not None
        nxt = _parse(steps[i + 1]["at"]) if i + 1 < len(steps) else None
        if at < hi and (nxt is None or nxt > lo):
            best = max(best, float(s["usd_per_hour"]))
    return best


# ---------------------------------------------------------------- the chart (SVG)

_W, _H = 760, 260
_L, _R, _T, _B = 70, 20, 16, 40  # margins: room for the y labels and the day labels
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _nice_top(v: float) -> tuple[float, float]:
    """An axis top at or above v and its tick step (4 or 5 ticks of 1, 2, 2.5 or 5 x 10^k)."""
    if v <= 0:
        return 1.0, 0.25
    raw = v / 4
    k = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * k
        if step * 4 >= v - 1e-12:
            break
    top = step * math.ceil(v / step - 1e-9)
    return (top if top > 0 else step), step


def _f(v: float) -> str:
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


def _day_label(d: datetime) -> str:
    return f"{d.day} {_MONTHS[d.month - 1]}"


def chart_points(chart: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The polyline's points in SVG coordinates: a step line, two points per change."""
    t0, t1 = _parse(chart["from"]), _parse(chart["to"])
    assert t0 is not None and t1 is not None
    span = max((t1 - t0).total_seconds(), 1.0)
    top, _ = _nice_top(max(float(s["usd_per_hour"]) for s in chart["steps"]))
    pw, ph = _W - _L - _R, _H - _T - _B

    def x(t: datetime) -> float:
        return round(_L + pw * (t - t0).total_seconds() / span, 1)

    def y(v: float) -> float:
        return round(_T + ph * (1 - v / top), 1)

    steps = chart["steps"]
    pts = [(x(t0), y(float(steps[0]["usd_per_hour"])))]
    for prev, s in zip(steps, steps[1:], strict=False):
        at = _parse(s["at"])
        assert at is not None
        pts.append((x(at), y(float(prev["usd_per_hour"]))))
        pts.append((x(at), y(float(s["usd_per_hour"]))))
    pts.append((x(t1), y(float(steps[-1]["usd_per_hour"]))))
    return pts


def chart_svg(chart: Mapping[str, Any]) -> str:
    """The chart as inline SVG: axes, a day grid, the step line and the area under it, with
    role="img", a <title> and a <desc>. The same data gives the same bytes."""
    t0, t1 = _parse(chart["from"]), _parse(chart["to"])
    assert t0 is not None and t1 is not None
    values = [float(s["usd_per_hour"]) for s in chart["steps"]]
    top, step = _nice_top(max(values))
    pw, ph = _W - _L - _R, _H - _T - _B
    span = max((t1 - t0).total_seconds(), 1.0)
    pts = chart_points(chart)
    peak = max(values)
    desc = (f"Step line of the fleet's price per hour from {_when(t0)} to {_when(t1)}: "
            f"now ${values[-1]:.3f}/h, peak ${peak:.3f}/h, {len(values) - 1} changes. "
            "The table below gives each day's peak and cost.")
    out = [f'<svg class="chart" role="img" aria-labelledby="chart-title chart-desc" '
           f'viewBox="0 0 {_W} {_H}" preserveAspectRatio="xMidYMid meet" '
           f'xmlns="http://www.w3.org/2000/svg">',
           f'<title id="chart-title">Fleet USD/h over the last {CHART_DAYS} days</title>',
           f'<desc id="chart-desc">{_esc(desc)}</desc>']
    out.append('<g class="grid">')
    n = round(top / step)
    for i in range(n + 1):
        v = step * i
        yy = _f(_T + ph * (1 - v / top))
        out.append(f'<line x1="{_L}" y1="{yy}" x2="{_W - _R}" y2="{yy}"/>')
        out.append(f'<text class="ylab" x="{_L - 8}" y="{yy}" dy="0.35em" '
                   f'text-anchor="end">${v:.2f}/h</text>')
    day = t0.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    while day < t1:
        xx = _f(_L + pw * (day - t0).total_seconds() / span)
        out.append(f'<line x1="{xx}" y1="{_T}" x2="{xx}" y2="{_T + ph}"/>')
        out.append(f'<text class="xlab" x="{xx}" y="{_H - _B + 18}" '
                   f'text-anchor="middle">{_day_label(day)}</text>')
        day += timedelta(days=1)
    out.append('</g>')
    base = _f(_T + ph)
    line = " ".join(f"{_f(px)},{_f(py)}" for px, py in pts)
    area = f"{_f(pts[0][0])},{base} {line} {_f(pts[-1][0])},{base}"
    out.append(f'<polygon class="area" points="{area}"/>')
    out.append(f'<polyline class="line" points="{line}"/>')
    ex, ey = pts[-1]
    out.append(f'<circle class="now" cx="{_f(ex)}" cy="{_f(ey)}" r="4"/>')
    out.append(f'<line class="axis" x1="{_L}" y1="{base}" x2="{_W - _R}" y2="{base}"/>')
    out.append(f'<text class="xlab" x="{_W - _R}" y="{_H - 4}" text-anchor="end">now (UTC)'
               '</text>')
    out.append('</svg>')
    return "\n".join(out)


def _esc(s: str) -> str:
    return str(Markup.escape(s))


def _when(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


# ---------------------------------------------------------------- the HTML

UNKNOWN = Markup('<span class="unk">unknown</span>')


def _usd(v: float | None, digits: int = 2) -> str:
    return UNKNOWN if v is None else f"${v:,.{digits}f}"


def _yes(v: bool | None) -> str:
    return UNKNOWN if v is None else ("yes" if v else "no")


def _time(ts: str | None) -> str:
    t = _parse(ts)
    return "—" if t is None else t.strftime("%Y-%m-%d %H:%M:%S UTC")


def _short_time(ts: str | None) -> str:
    t = _parse(ts)
    return "—" if t is None else f"{_day_label(t)} {t:%H:%M} UTC"


def _clock(ts: str | None, today: str | None = None) -> str:
    """HH:MM on the page's own UTC day, with the day before it on any other."""
    t, ref = _parse(ts), _parse(today)
    if t is None:
        return "—"
    return f"{t:%H:%M}" if ref and ref.date() == t.date() else f"{_day_label(t)} {t:%H:%M}"


def _num(v: float | int | None, digits: int = 1) -> str:
    if v is None:
        return UNKNOWN
    return f"{v:,}" if isinstance(v, int) else f"{v:,.{digits}f}"


_ICON = {"well": "✓", "problem": "!", "down": "✕", "unknown": "?", "owed": "…"}

_env = Environment(autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                   lstrip_blocks=True, keep_trailing_newline=True)
_env.filters.update(usd=_usd, yes=_yes, time=_time, short_time=_short_time, clock=_clock,
                    num=_num)
_env.globals.update(icon=_ICON)

_CSS = """
:root{--fg:#1b1f24;--muted:#565e6a;--line:#d8dce2;--bg:#f4f5f7;--card:#fff;--accent:#1f4fbf;
--ok:#0c6a2d;--ok-bg:#e2f3e7;--bad:#a1121d;--bad-bg:#fde7e9;--warn:#744b00;--warn-bg:#fff0c9;
--off:#4a5260;--off-bg:#eceef1}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;color:var(--fg);background:var(--bg);
font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
main{max-width:1320px;margin:0 auto;padding:1.25rem 1rem 2rem}
h1{font-size:1.6rem;margin:0}
h2{font-size:1.05rem;margin:0 0 .5rem}
header{display:flex;flex-wrap:wrap;align-items:baseline;justify-content:space-between;
gap:.25rem 1.5rem;margin-bottom:1rem}
header p{margin:0;color:var(--muted)}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(16rem,1fr));gap:1rem;
margin-bottom:1rem}
.card,section{background:var(--card);border:1px solid var(--line);border-radius:10px;
padding:1rem .9rem}
section{margin-bottom:1rem}
.big{font-size:1.7rem;font-weight:650;font-variant-numeric:tabular-nums;line-height:1.2}
.sub{color:var(--muted);margin:.15rem 0 .6rem}
.unit{font-size:1rem;font-weight:400;color:var(--muted)}
.over{color:var(--bad)}
.rule{margin:.6rem 0 0;padding-top:.6rem;border-top:1px solid var(--line);font-size:.93rem}
dl.figs{display:grid;grid-template-columns:1fr auto;gap:.2rem 1rem;margin:0}
dl.figs dt{color:var(--muted)}
dl.figs dd{margin:0;text-align:right;font-variant-numeric:tabular-nums;font-weight:600}
.bar{height:.55rem;border-radius:99px;background:var(--off-bg);margin:.7rem 0 .2rem;
overflow:hidden}
.bar span{display:block;height:100%;background:var(--accent)}
.bar.over span{background:var(--bad)}
ul.plain{list-style:none;margin:0;padding:0}
ul.plain li{display:flex;justify-content:space-between;gap:1rem}
.counts{display:flex;flex-wrap:wrap;gap:.4rem;margin-top:.3rem}
.table-wrap{overflow-x:auto}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:650;font-size:1.05rem;padding:0 0 .6rem}
caption small{font-weight:400;color:var(--muted);margin-left:.4rem}
th,td{padding:.5rem .45rem;border-bottom:1px solid var(--line);text-align:left;
vertical-align:top}
table.dense{font-size:.875rem}
table.dense td.v{min-width:11.5rem}
table.dense th,table.dense td{padding:.5rem .35rem}
.unk{color:var(--warn);font-size:.85em}
.nowrap{white-space:nowrap}
thead th{font-size:.82rem;color:var(--muted);border-bottom:2px solid var(--line);
vertical-align:bottom}
tbody th{font-weight:600;white-space:nowrap}
tfoot th,tfoot td{font-weight:650;border-bottom:0;border-top:2px solid var(--line)}
.num{text-align:right;white-space:nowrap}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:.88em}
.muted{color:var(--muted)}
.empty td{color:var(--muted);font-style:italic}
.status{display:inline-block;padding:.05rem .55rem;border-radius:99px;font-weight:650;
white-space:nowrap;font-size:.9rem}
.status .i{display:inline-block;width:1em;text-align:center;margin-right:.2rem}
.well{color:var(--ok);background:var(--ok-bg)}
.problem,.down{color:var(--bad);background:var(--bad-bg)}
.unknown,.owed{color:var(--warn);background:var(--warn-bg)}
.status.zero{color:var(--off);background:var(--off-bg);font-weight:500}
.tag{display:inline-block;padding:0 .45rem;border-radius:6px;font-size:.85rem;font-weight:600}
.tag.behind,.tag.other{color:var(--bad);background:var(--bad-bg)}
.tag.current{color:var(--ok);background:var(--ok-bg)}
.tag.ahead,.tag.unknown{color:var(--warn);background:var(--warn-bg)}
ul.problems{margin:.3rem 0 0;padding-left:1.1rem;color:var(--bad);font-size:.88rem;
max-width:34rem}
.notice{border-left:4px solid var(--bad);padding:.5rem .8rem;background:var(--bad-bg);
color:var(--bad);border-radius:6px;margin:0 0 1rem}
figure{margin:0}
svg.chart{width:100%;height:auto;display:block;max-height:320px}
svg.chart .grid line{stroke:var(--line);stroke-width:1}
svg.chart .axis{stroke:var(--muted);stroke-width:1}
svg.chart text{fill:var(--muted);font-size:12px;font-family:inherit}
svg.chart .area{fill:var(--accent);fill-opacity:.12;stroke:none}
svg.chart .line{fill:none;stroke:var(--accent);stroke-width:2.2;stroke-linejoin:round}
svg.chart .now{fill:var(--accent)}
figcaption{color:var(--muted);font-size:.9rem;margin:.3rem 0 .8rem}
.chart-grid{display:grid;grid-template-columns:minmax(0,2.2fr) minmax(18rem,1fr);gap:1.5rem;
align-items:start}
footer{color:var(--muted);font-size:.88rem;margin-top:1.5rem}
a{color:var(--accent)}
@media (max-width:900px){.chart-grid{grid-template-columns:1fr}}
@media (max-width:760px){
main{padding:.75rem .6rem 1.5rem}
section,.card{padding:.8rem .7rem}
table.stack caption{display:block}
table.stack thead{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}
table.stack,table.stack tbody,table.stack tfoot{display:block;width:100%}
table.stack tr{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:.45rem 1rem;
border:1px solid var(--line);border-radius:8px;margin-bottom:.7rem;padding:.6rem .75rem}
table.stack tr>*{display:block;border:0;padding:0;text-align:left;white-space:normal}
table.stack [data-th]::before{content:attr(data-th);display:block;font-size:.72rem;
font-weight:600;color:var(--muted);text-transform:uppercase;letter-spacing:.03em}
table.stack tbody th[data-th]::before{display:none}
table.stack tbody th{font-size:1.05rem}
table.stack .wide,table.stack .empty td{grid-column:1/-1}
table.stack td.na,table.stack tfoot td:empty{display:none}
table.stack tfoot tr{border-style:dashed}
ul.problems{max-width:none}
}
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="generator" content="fleet page">
<title>Fleet: {{ d.totals.boxes }} live boxes, {{ d.totals.usd_per_hour|usd(3) }}/h</title>
<link rel="icon" href="data:,">
{% if d.interval_s %}
<meta http-equiv="refresh" content="{{ [d.interval_s|int, 5]|max }}">
{% endif %}
<style>{{ css }}</style>
</head>
<body>
<main>
<header>
<h1>Fleet</h1>
<p>Generated
 <time datetime="{{ d.generated_at }}" id="generated-at">{{ d.generated_at|time }}</time>
{% if d.interval_s %}
 · rewritten every {{ d.interval_s|int }} s
{% else %}
 · a snapshot: run <code>fleet page</code> again to refresh
{% endif %}
</p>
</header>
{% if d.check_error %}
<p class="notice" role="status"><strong>Standing boxes not checked:</strong>
 {{ d.check_error }}</p>
{% endif %}
<div class="cards">
<div class="card" id="standing">
<h2>Standing boxes</h2>
<div class="big">{{ d.standing.count }}
 <span class="unit">{{ plural(d.standing.count, "box", "boxes") }}</span></div>
<p class="sub">{{ d.standing.usd_per_hour|usd(3) }}/h · {{ d.standing.usd_per_day|usd }}/day</p>
<ul class="plain">
{% for r in d.standing.roles %}
<li><span>role <strong>{{ r.role }}</strong></span>
<span>{{ r.boxes }}{% if r.wanted is not none %} of {{ r.wanted }} wanted{% endif %}</span></li>
{% else %}
<li><span class="muted">no standing role</span></li>
{% endfor %}
</ul>
<p class="rule">{{ d.standing.rule }}</p>
</div>
<div class="card" id="money">
<h2>Money today (UTC)</h2>
<div class="big">{{ d.money.projected_day_usd|usd }}
 <span class="unit">projected of {{ d.money.daily_budget_usd|usd }} budget
{%- if not d.money.fits %}: <strong class="over">OVER</strong>{% endif %}</span></div>
<div class="bar{{ '' if d.money.fits else ' over' }}" aria-hidden="true">
<span style="width:{{ bar }}%"></span></div>
<dl class="figs">
<dt>Spent today</dt><dd>{{ d.money.spent_today_usd|usd }}
 <span class="unit">{{ d.money.spent_from_bills.boxes }} of {{ d.money.spent_from_bills.of }}
 boxes from the bills</span></dd>
<dt>Committed until midnight</dt><dd>{{ d.money.committed_until_midnight_usd|usd }}</dd>
<dt>Daily budget</dt><dd>{{ d.money.daily_budget_usd|usd }}</dd>
<dt>Headroom</dt><dd>{{ d.money.headroom_usd|usd }}</dd>
</dl>
</div>
<div class="card" id="health">
<h2>All live boxes</h2>
<div class="big">{{ d.totals.boxes }}
 <span class="unit">{{ plural(d.totals.boxes, "box", "boxes") }}</span></div>
<p class="sub">{{ d.totals.usd_per_hour|usd(3) }}/h · {{ d.totals.usd_per_day|usd }}/day</p>
<div class="counts">
{% for v in verdicts %}
{{ pill(v, d.totals.verdicts[v] ~ " " ~ v, d.totals.verdicts[v] == 0) }}
{% endfor %}
{{ pill("owed", d.totals.owed ~ " owed", d.totals.owed == 0) }}
</div>
<p class="sub" style="margin-top:.6rem">Checked {{ d.checked_at|time }}</p>
</div>
</div>

<section>
<div class="table-wrap">
<table id="boxes" class="stack dense">
<caption>Live boxes <small>worst verdict first, then by label; times UTC</small></caption>
<thead>
<tr>
{% for h in box_headers %}
<th scope="col"{% if h in numeric %} class="num"{% endif %}>{{ h }}</th>
{% endfor %}
</tr>
</thead>
<tbody>
{% for b in d.boxes %}
<tr data-label="{{ b.label }}" data-verdict="{{ b.verdict }}">
<th scope="row" data-th="Label">{{ b.label }}</th>
<td data-th="Role">{{ b.role }}</td>
<td data-th="Card"><span class="nowrap">{{ b.card }}</span>
{%- if b.gpus != 1 %} <span class="nowrap">× {{ b.gpus }}</span>{% endif %}</td>
<td data-th="Provider">{{ b.provider }}</td>
<td data-th="Standing">{{ b.standing|yes }}</td>
<td data-th="Up (h)" class="num">{{ b.uptime_h|num }}</td>
<td data-th="USD/h" class="num">{{ b.usd_per_hour|usd(3) }}/h</td>
{% if b.job is none %}
<td data-th="Synced">{{ b.synced|yes }}</td>
<td data-th="Blocks" class="num">{{ b.blocks|num }}</td>
<td data-th="Release" class="wide">
{%- if b.release.running %}<code title="node sha16">{{ b.release.running }}</code> {% endif -%}
<span class="tag {{ b.release.state }}">{{ release_word[b.release.state] }}</span>
{%- if b.release.state != 'current' and b.release.wanted %}
<br><span class="muted">wanted <code>{{ b.release.wanted }}</code></span>
{%- endif %}</td>
{% else %}
<td data-th="Synced" class="na"><span class="muted">n/a</span></td>
<td data-th="Blocks" class="num na"><span class="muted">n/a</span></td>
<td data-th="Release" class="na"><span class="muted">n/a</span></td>
{% endif %}
<td data-th="Last check" class="nowrap">{{ b.checked_at|clock(d.generated_at) }}</td>
{% if b.job %}
<td data-th="Job" class="wide"><strong>{{ b.job.name or "no job" }}</strong>
<br><span class="nowrap">{{ b.job.phase or "unknown" }} · {{ b.job.age_min|num(0) }} min</span>
{%- if b.job.ttl_left_min is not none %}
<br><span class="muted nowrap">
{%- if b.job.ttl_left_min > 0 %}{{ b.job.ttl_left_min|num(0) }} min to its deadline
{%- else %}past its deadline{% endif %}</span>
{%- endif %}</td>
{% else %}
<td data-th="Job" class="na"><span class="muted">—</span></td>
{% endif %}
<td data-th="Verdict" class="v wide">{{ pill(b.verdict, b.verdict) }}
{% if b.problems %}
<ul class="problems">
{% for p in b.problems %}
<li>{{ p }}</li>
{% endfor %}
</ul>
{% endif %}
</td>
</tr>
{% else %}
<tr class="empty"><td colspan="{{ box_headers|length }}">No live boxes.</td></tr>
{% endfor %}
</tbody>
<tfoot>
<tr><th scope="row" colspan="6" class="wide">Total:
 {{ d.totals.boxes }} live {{ plural(d.totals.boxes, "box", "boxes") }}</th>
<td data-th="USD/h" class="num" id="total-usd-per-hour">{{ d.totals.usd_per_hour|usd(3) }}/h</td>
<td colspan="{{ box_headers|length - 7 }}" data-th="USD/day" id="total-usd-per-day">
{{- d.totals.usd_per_day|usd }}/day</td></tr>
</tfoot>
</table>
</div>
</section>

<section>
<div class="table-wrap">
<table id="owed" class="stack">
<caption>Owed <small>wanted boxes no provider can give yet; kept out of spend</small></caption>
<thead>
<tr>
{% for h in owed_headers %}
<th scope="col"{% if h in numeric %} class="num"{% endif %}>{{ h }}</th>
{% endfor %}
</tr>
</thead>
<tbody>
{% for o in d.owed %}
<tr>
<th scope="row" data-th="Role">{{ o.role }}</th>
<td data-th="Provider">{{ o.provider }}</td>
<td data-th="Card">{{ o.card }}</td>
<td data-th="GPUs" class="num">{{ o.gpus }}</td>
<td data-th="Reason" class="wide">{{ pill("owed", "owed") }} {{ o.reason }}</td>
<td data-th="Owed since">{{ o.since|short_time }}</td>
<td data-th="For (h)" class="num">{{ o.owed_h|num }}</td>
</tr>
{% else %}
<tr class="empty"><td colspan="{{ owed_headers|length }}">Nothing owed.</td></tr>
{% endfor %}
</tbody>
</table>
</div>
</section>

<section id="cost-chart">
<h2>USD/h over the last {{ days }} days</h2>
<div class="chart-grid">
<figure>
{{ svg }}
<figcaption>The sum of the live boxes' prices at each moment, from the registry's history
 ({{ d.chart['from']|short_time }} to {{ d.chart['to']|short_time }}).
 Now {{ d.chart.now_usd_per_hour|usd(3) }}/h.</figcaption>
</figure>
<div class="table-wrap">
<table id="chart-data">
<caption>The chart's data, by UTC day</caption>
<thead><tr><th scope="col">Day</th><th scope="col" class="num">Peak USD/h</th>
<th scope="col" class="num">Cost (USD)</th></tr></thead>
<tbody>
{% for r in d.chart.days %}
<tr><th scope="row">{{ r.day }}
{%- if r['from'][11:16] != "00:00" %}<br><small class="muted">from {{ r['from'][11:16] }}</small>
{%- endif %}
{%- if r['to'][11:16] != "00:00" %}<br><small class="muted">until {{ r['to'][11:16] }}</small>
{%- endif %}</th>
<td class="num">{{ r.peak_usd_per_hour|usd(3) }}/h</td><td class="num">{{ r.spent_usd|usd }}</td>
</tr>
{% endfor %}
</tbody>
</table>
</div>
</div>
</section>

<footer>
<p>Written by <code>fleet page</code> from the registry, <code>fleet check</code> and the
 one-shot watchdog. The same data as JSON: <a href="fleet.json">fleet.json</a>. Prices are the
 billed USD per hour recorded at rent time; times are UTC. No keys, SSH endpoints or addresses
 are published here.</p>
</footer>
</main>
</body>
</html>
"""

_BOX_HEADERS = ("Label", "Role", "Card", "Provider", "Standing", "Up (h)", "USD/h", "Synced",
                "Blocks", "Release", "Last check", "Job (phase · age)", "Verdict")
_OWED_HEADERS = ("Role", "Provider", "Card", "GPUs", "Reason", "Owed since", "For (h)")
_NUMERIC = ("Up (h)", "USD/h", "Blocks", "GPUs", "For (h)")


def _pill(state: str, text: str, zero: bool = False) -> Markup:
    """A status as colour AND word: the state's colour, an icon and the text."""
    cls = f"status {state}{' zero' if zero else ''}"
    return Markup('<span class="{}"><span class="i" aria-hidden="true">{}</span>{}</span>'
                  ).format(cls, _ICON[state], text)


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many

_RELEASE_WORD = {"current": "current", "behind": "behind", "ahead": "ahead",
                 "other": "not the wanted one", "unknown": "unknown"}


def render(data: Mapping[str, Any]) -> str:
    """The page's HTML from its data: self-contained, no script, the same bytes for the same
    data."""
    money = data["money"]
    budget_usd = float(money["daily_budget_usd"])
    used = float(money["projected_day_usd"])
    bar = 100.0 if budget_usd <= 0 else min(100.0, max(0.0, 100 * used / budget_usd))
    return _env.from_string(_TEMPLATE).render(
        d=data, css=Markup(_CSS.strip()), svg=Markup(chart_svg(data["chart"])),
        verdicts=VERDICTS, release_word=_RELEASE_WORD, days=CHART_DAYS, bar=f"{bar:.1f}",
        box_headers=_BOX_HEADERS, owed_headers=_OWED_HEADERS, numeric=_NUMERIC, pill=_pill,
        plural=_plural)


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
    doc = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    paths = (out_dir / "fleet.json", out_dir / "index.html")
    try:
        write_atomic(paths[0], doc)
        write_atomic(paths[1], html)
    except OSError as e:
        raise UsageError(f"page directory {out_dir}: cannot write: {e.strerror or e}") from None
    return paths
