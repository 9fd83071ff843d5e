"""The page's data: the `fleet.json` document, built from an allow-list of fields.

`build` turns the registry's rows, `fleet check`'s verdicts and the meter watchdog's into the
page's data. It never carries a key, an SSH endpoint, an IP address or a host key: the data is
assembled field by field from the rows (never by copying a row), and every free text (problems,
refusals, reasons) goes through `Scrubber`, which removes the registry's endpoints and anything
that reads as an address or a key.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fleet.core.boxes import Row, is_standing
from fleet.core.times import iso, read_iso
from fleet.core.verdicts import VERDICTS, Health, Owed, Watch
from fleet.ops import budget
from fleet.page.chart import chart_data

if TYPE_CHECKING:
    from fleet.core.config import Config

SCHEMA = 1
RULE = ("Standing boxes stay up, are never destroyed when a job ends, and are replaced in the "
        "same shape when their host dies.")
# worst first: the order of the rows and of the summary


# ---------------------------------------------------------------- free text

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
    money = budget.today(rows, cfg.daily_budget_usd, now, billed)
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
        "money": money.to_dict(),
        "boxes": boxes,
        "owed": owed_rows,
        "chart": chart_data(history if history is not None else rows, now),
    }


def _hours(since: str | None, now: datetime) -> float | None:
    t = read_iso(since)
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
    created = read_iso(r.created_at)
    expires = read_iso(r.expires_at)
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
    since = read_iso(str(d.get("since") or ""))
    return {"role": str(d["role"]), "provider": str(d["provider"]), "card": str(d["card"]),
            "gpus": int(d["gpus"]), "reason": scrub(str(d["reason"])),
            "since": iso(since) if since else None,
            "owed_h": _hours(iso(since), now) if since else None}

