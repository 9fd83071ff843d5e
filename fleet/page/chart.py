"""The page's cost chart: the fleet's USD/h over the last days, as data (`chart_data`, part of
`fleet.json`) and as an inline SVG step line (`chart_svg`) drawn from that data alone."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from markupsafe import Markup

from fleet.core.times import iso, next_utc_day_start, read_iso, utc_day, utc_day_start

if TYPE_CHECKING:
    from fleet.core.boxes import Row

CHART_DAYS = 7


# ---------------------------------------------------------------- the chart's data

def chart_data(rows: Iterable[Row], now: datetime, days: int = CHART_DAYS) -> dict[str, Any]:
    """The fleet's USD/h over the last `days` days: at any moment the sum of the prices of the
    rows live then (a failed rent never billed, as in the budget). `steps` holds the value at
    the window's start, then one entry per change; `days` holds each UTC day's peak and what it
    cost (today's equals the budget's spent today)."""
    start = now - timedelta(days=days)
    spans: list[tuple[datetime, datetime, float]] = []
    for r in rows:
        t0 = read_iso(r.created_at)
        if t0 is None or r.status == "failed":
            continue
        t1 = read_iso(r.destroyed_at)
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
    day = utc_day_start(start)
    while day < now:
        lo, hi = max(day, start), min(next_utc_day_start(day), now)
        spent = sum(usd * (min(t1, hi) - max(t0, lo)).total_seconds() / 3600
                    for t0, t1, usd in spans if min(t1, hi) > max(t0, lo))
        day_rows.append({"day": utc_day(day), "from": iso(lo), "to": iso(hi),
                         "peak_usd_per_hour": _peak(steps, lo, hi),
                         "spent_usd": round(spent, 6)})
        day = next_utc_day_start(day)
    return {"unit": "USD/h", "from": iso(start), "to": iso(now),
            "now_usd_per_hour": steps[-1]["usd_per_hour"], "steps": steps, "days": day_rows}


def _money(v: float) -> float:
    v = round(v, 6)
    return 0.0 if v == 0 else v  # no -0.0


def _peak(steps: Sequence[Mapping[str, Any]], lo: datetime, hi: datetime) -> float:
    """The highest USD/h between lo and hi: the step in force at lo and every change before hi."""
    best = 0.0
    for i, s in enumerate(steps):
        at = read_iso(s["at"])
        assert at is not None
        nxt = read_iso(steps[i + 1]["at"]) if i + 1 < len(steps) else None
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


def day_label(d: datetime) -> str:
    return f"{d.day} {_MONTHS[d.month - 1]}"


def chart_points(chart: Mapping[str, Any]) -> list[tuple[float, float]]:
    """The polyline's points in SVG coordinates: a step line, two points per change."""
    t0, t1 = read_iso(chart["from"]), read_iso(chart["to"])
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
        at = read_iso(s["at"])
        assert at is not None
        pts.append((x(at), y(float(prev["usd_per_hour"]))))
        pts.append((x(at), y(float(s["usd_per_hour"]))))
    pts.append((x(t1), y(float(steps[-1]["usd_per_hour"]))))
    return pts


def chart_svg(chart: Mapping[str, Any]) -> str:
    """The chart as inline SVG: axes, a day grid, the step line and the area under it, with
    role="img", a <title> and a <desc>. The same data gives the same bytes."""
    t0, t1 = read_iso(chart["from"]), read_iso(chart["to"])
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
    day = next_utc_day_start(t0)
    while day < t1:
        xx = _f(_L + pw * (day - t0).total_seconds() / span)
        out.append(f'<line x1="{xx}" y1="{_T}" x2="{xx}" y2="{_T + ph}"/>')
        out.append(f'<text class="xlab" x="{xx}" y="{_H - _B + 18}" '
                   f'text-anchor="middle">{day_label(day)}</text>')
        day = next_utc_day_start(day)
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

