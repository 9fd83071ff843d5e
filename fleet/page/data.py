"""The page's data: the `fleet.json` document, built from an allow-list of fields.

`build` turns the registry's rows, `fleet check`'s verdicts and the meter watchdog's into the
page's data. Where this machine has no key for a provider, its standing boxes are not checked
now: their verdicts (and the owed boxes) come from the loop's last tick
(`fleet.state.last_tick`), each with that tick's time, and the data's `sources` says which parts
are live and which are not (`sources["note"]`, the page's notice).

It never carries a key, an SSH endpoint, an IP address or a host key: the data is assembled
field by field from the rows (never by copying a row), and every free text (problems, refusals,
reasons, the sources' note) goes through `Scrubber`, which removes the registry's endpoints and
anything that reads as an address or a key.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fleet.core.boxes import Row, is_standing
from fleet.core.config import KEY_ENV
from fleet.core.states import BoxKind, ReleaseOrder, node_release
from fleet.core.times import iso, read_iso, utc_day
from fleet.core.verdicts import VERDICTS, Health, Owed, Watch, mesh_summary
from fleet.ops import budget, spread
from fleet.page.chart import chart_data
from fleet.page.words import age_words, day_time, duration
from fleet.state.bills import MAX_AGE_S
from fleet.state.last_tick import STALE_INTERVALS

if TYPE_CHECKING:
    from fleet.core.config import Config
    from fleet.state.last_tick import LastTick

SCHEMA = 1
RULE = ("Standing boxes stay up, are never destroyed when a job ends, and are replaced in the "
        "same shape when their host dies.")
# worst first: the order of the rows and of the summary


# ---------------------------------------------------------------- free text

# an address may end a sentence ("no route to 198.18.0.9."), never run on into a version
_IPV4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\w|\.\w)")
_IPV6 = re.compile(r"(?<![\w:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])")
_KEYS = re.compile(r"\b(?:ssh-(?:ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+)\s+[A-Za-z0-9+/=]{16,}"
                   r"|\bhf_[A-Za-z0-9]{16,}|-----BEGIN [A-Z ]+-----")
_ENV_SECRETS = ("RUNPOD_API_KEY", "VAST_API_KEY", "HF_TOKEN")


class Scrubber:
    """Removes what must never be published from free text: the registry's SSH endpoints, IP
    addresses and host keys and the values of the key variables of the environment (known
    values first), then anything that reads as an IP address or a key.

    The known values are replaced one after another, longest first, each over the text the ones
    before it left (so "host:port" goes before "host"). A text is searched once through an index
    of where each value may start (its first two characters), so scrubbing a text costs the
    same however many boxes the registry holds; only the values found are replaced, in that
    same order. (One regex alternation would not do: Python's `re` tries its alternatives one by
    one at each position, and the leftmost match differs from the longest-first order where two
    values overlap.)"""

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
        self.known = sorted(known, key=lambda s: (-len(s), s))
        self._rank = {v: i for i, v in enumerate(self.known)}
        starts: dict[str, set[int]] = {}  # first two characters -> the lengths of the values
        for v in self.known:
            if len(v) > 1:
                starts.setdefault(v[:2], set()).add(len(v))
        self._starts = {k: sorted(ls) for k, ls in starts.items()}
        self._chars = {v for v in self.known if len(v) == 1}

    def __call__(self, text: str) -> str:
        done = -1  # the rank of the last value replaced
        while later := [i for i in self._found(text) if i > done]:
            done = min(later)
            text = text.replace(self.known[done], "[redacted]")
        text = _KEYS.sub("[redacted key]", text)
        text = _IPV4.sub(lambda m: _address(m.group(0)), text)
        return _IPV6.sub(lambda m: _address(m.group(0)), text)

    def _found(self, text: str) -> set[int]:
        """The ranks of the known values that occur in `text`."""
        found = {self._rank[c] for c in self._chars.intersection(text)}
        n = len(text)
        for p in range(n - 1):
            for length in self._starts.get(text[p:p + 2], ()):
                if length > n - p:
                    break
                v = text[p:p + length]
                if v in self._rank:
                    found.add(self._rank[v])
        return found


def _address(token: str) -> str:
    try:
        ipaddress.ip_address(token)
    except ValueError:
        return token
    return "[address]"


# ---------------------------------------------------------------- the data

@dataclass(frozen=True)
class PageInputs:
    """What the page's data is built from (`build`): explicit fields only.

    + cfg: the fleet's configuration (roles, roster, budget)
    + rows: the registry's rows (destroyed ones too): live ones are listed, all count for money
    + health: `fleet.check.check`'s verdicts on the standing boxes checked now
    + watched: `fleet.watchdog.watch`'s verdicts on the one-shot boxes
    + now: the time the page describes (UTC)
    + history: the rows the USD/h chart is drawn from (default: `rows`)
    + owed: wanted boxes no provider can give yet, with their reasons (the loop's memory)
    + checked_at: when `health` and `watched` were read (default: `now`)
    + check_error: why the standing boxes could not be checked (their verdict is unknown)
    + interval_s: how often the page is rewritten (the loop's tick), when it is
    + billed: spent today by label from the providers' bills (`fleet.bills.billed`); other
      rows are estimated from their price
    + keyless: providers with no API key here. Their standing boxes are not checked now: each
      shows `last_tick`'s verdict, with that tick's time, and the owed boxes are the tick's
      too (`owed` is then unused); with no tick on record, both are unknown
    + last_tick: the loop's last tick (`fleet.state.last_tick.load`), None when none is on record
    + bills_at: when the cached bills behind `billed` were read, for the page's sources
    """

    cfg: Config
    rows: Sequence[Row]
    health: Sequence[Health]
    watched: Sequence[Watch]
    now: datetime
    history: Sequence[Row] | None = None
    _: KW_ONLY
    owed: Sequence[Owed | Mapping[str, Any]] = ()
    checked_at: datetime | None = None
    check_error: str | None = None
    interval_s: float | None = None
    billed: Mapping[str, float] | None = None
    keyless: Collection[str] = ()
    last_tick: LastTick | None = None
    bills_at: str | None = None


def build(inputs: PageInputs) -> dict[str, Any]:
    """The page's data (the `fleet.json` document), from explicit fields only (`PageInputs`).

    Example: `build(PageInputs(cfg, reg.rows(), check(cfg, built), watch(cfg, reg),
    datetime.now(UTC)))`
    """
    cfg, rows, check_error = inputs.cfg, inputs.rows, inputs.check_error
    now = inputs.now.astimezone(UTC)
    scrub = Scrubber([*rows, *(inputs.history or ())])
    live_rows = [r for r in rows if r.live]
    checked_path = [r for r in live_rows
                    if is_standing(cfg, r) or r.kind != BoxKind.ONESHOT]  # the check's boxes
    from_tick = {r.provider for r in checked_path} & set(inputs.keyless)
    tick = inputs.last_tick if from_tick else None
    boxes = _boxes(inputs, now, live_rows, checked_path, from_tick, scrub)
    places = spread.per_place(rows)
    _placed(boxes, live_rows, places, scrub)
    boxes.sort(key=lambda b: (VERDICTS.index(b["verdict"]), b["label"]))

    live_rate = budget.rate(b["usd_per_hour"] for b in boxes)
    standing_boxes = [b for b in boxes if b["standing"]]
    standing_rate = budget.rate(b["usd_per_hour"] for b in standing_boxes)
    money = budget.today(rows, cfg.daily_budget_usd, now, inputs.billed).to_dict()
    owed_known: Sequence[Owed | Mapping[str, Any]] | None = inputs.owed
    if from_tick:  # the loop's owed boxes, as of the tick the verdicts come from
        owed_known = tick.owed if tick is not None else None
    owed_rows = sorted((_owed(o, now, scrub) for o in owed_known or ()),
                       key=lambda o: (o["since"] or "", o["role"], o["provider"], o["card"]))
    sources = _sources(cfg, now, boxes, checked_path, sorted(from_tick),
                       sorted(inputs.keyless), tick, owed_known is not None, money,
                       inputs.bills_at, check_error)
    return {
        "schema": SCHEMA,
        "generated_at": iso(now),
        "checked_at": iso(inputs.checked_at or now),
        "interval_s": inputs.interval_s,
        "check_error": scrub(check_error) if check_error else None,
        "sources": {**sources, "note": scrub(sources["note"]) if sources["note"] else None},
        "standing": {
            "count": len(standing_boxes),
            "usd_per_hour": round(standing_rate.usd_per_hour, 6),
            "usd_per_day": round(standing_rate.usd_per_day, 6),
            "roles": _roles(cfg, standing_boxes),
            "rule": RULE,
        },
        "totals": {
            "boxes": len(boxes),
            "usd_per_hour": round(live_rate.usd_per_hour, 6),
            "usd_per_day": round(live_rate.usd_per_day, 6),
            **_verdict_counts(boxes),
            "owed": len(owed_rows) if owed_known is not None else None,
        },
        "money": money,
        # how many live boxes each place holds: one host failure takes them all
        "places": {scrub(k): n for k, n in places.items()},
        "mesh": _mesh(standing_boxes, cfg),
        "boxes": boxes,
        "owed": owed_rows,
        "chart": chart_data(inputs.history if inputs.history is not None else rows, now),
    }


def _boxes(inputs: PageInputs, now: datetime, live_rows: Sequence[Row],
           checked_path: Sequence[Row], from_tick: Collection[str],
           scrub: Scrubber) -> list[dict[str, Any]]:
    """Every live box, judged where its verdict comes from: the loop's last tick (its
    provider has no key here), `fleet check` (the check's boxes) or the meter watchdog."""
    cfg, check_error = inputs.cfg, inputs.check_error
    checked = iso(inputs.checked_at or now)
    by_health = {h.label: h for h in inputs.health}
    by_watch = {w.label: w for w in inputs.watched}
    checked_labels = {r.label for r in checked_path}
    tick = inputs.last_tick if from_tick else None
    boxes = []
    for r in live_rows:
        standing = is_standing(cfg, r)
        if r.label in checked_labels and r.provider in from_tick:
            boxes.append(_tick_box(r, standing, tick, now, scrub))
        elif r.label in checked_labels:
            why = f"not checked: {check_error}" if check_error else "not checked"
            boxes.append(_standing_box(r, standing, by_health.get(r.label), checked, why,
                                       "live", now, scrub))
        else:
            boxes.append(_oneshot_box(r, by_watch.get(r.label), checked, now, scrub))
    return boxes


def _placed(boxes: Sequence[dict[str, Any]], live_rows: Sequence[Row],
            places: Mapping[str, int], scrub: Scrubber) -> None:
    """Where each box runs (`fleet.ops.spread`) and how many live boxes are there."""
    place_of = {r.label: r.place for r in live_rows}
    for b in boxes:
        where = place_of.get(b["label"])
        b["place"] = scrub(where) if where else None  # provider text: scrubbed like any
        b["place_boxes"] = places.get(where, 0) if where else None


def _roles(cfg: Config, standing_boxes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each standing role's boxes against the roster's wanted count."""
    wanted: dict[str, int] = {}
    for w in cfg.roster:
        wanted[w.role] = wanted.get(w.role, 0) + w.count
    have: dict[str, int] = {}
    for b in standing_boxes:
        have[b["role"]] = have.get(b["role"], 0) + 1
    return [{"role": name, "boxes": have.get(name, 0), "wanted": wanted.get(name)}
            for name in sorted(set(have) | {n for n in wanted
                                            if cfg.roles.get(n) and
                                            cfg.roles[n].kind == BoxKind.STANDING})]


def _verdict_counts(boxes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {
        "verdicts": {v: sum(1 for b in boxes if b["verdict"] == v) for v in VERDICTS},
        # the same counts by where each verdict came from: checked now, the loop's last
        # tick, or nowhere (no key here and no tick on record)
        "verdicts_from": {src: {v: sum(1 for b in boxes if b["verdict"] == v
                                       and b["verdict_from"] == src) for v in VERDICTS}
                          for src in VERDICT_SOURCES},
    }


def _mesh(boxes: Sequence[Mapping[str, Any]], cfg: Config) -> dict[str, Any]:
    """The p2p mesh over the standing boxes, in all and per network (`Config.network_of`,
    sorted by name, with its roles and its boxes): how many nodes have each inbound count
    (unknown apart), how many of those known are dialled by a peer, which are star-only and
    which are owed a port."""
    def summary(mine: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        peers = [(b["label"], b.get("peers") or {}) for b in mine]
        return {**mesh_summary([(label, p.get("in"), p.get("star_only")) for label, p in peers]),
                "owed_port": sorted(label for label, p in peers if p.get("port_owed"))}

    by_network: dict[str, list[Mapping[str, Any]]] = {}
    for b in boxes:
        by_network.setdefault(cfg.network_of(b["role"]), []).append(b)
    return {**summary(boxes), "networks": [
        {"network": name, "roles": list(cfg.network_roles(name)), "boxes": len(mine),
         **summary(mine)} for name, mine in sorted(by_network.items())]}


LOW_DISK_SHARE = 0.15  # a disk with less free than this is flagged: a full disk stops a node


def disk_of(h: Health | None) -> dict[str, Any]:
    """The free space where a box's agent writes, as a share of its disk, and whether it is
    low (None throughout when the check could not read it)."""
    if h is None or h.disk_free is None or not h.disk_total:
        return {"free_bytes": None, "total_bytes": None, "free_share": None, "low": None}
    share = h.disk_free / h.disk_total
    return {"free_bytes": h.disk_free, "total_bytes": h.disk_total,
            "free_share": round(share, 3), "low": share < LOW_DISK_SHARE}


# where a box's verdict came from: checked (or watched) now, the loop's last tick, or nowhere
VERDICT_SOURCES = ("live", "last_tick", "none")


# ---------------------------------------------------------------- where the figures come from

def _sources(cfg: Config, now: datetime, boxes: Sequence[Mapping[str, Any]],
             checked_path: Sequence[Row], from_tick: list[str], keyless: list[str],
             tick: LastTick | None, owed_known: bool, money: Mapping[str, Any],
             bills_at: str | None, check_error: str | None = None) -> dict[str, Any]:
    """Which parts of the page are live and which are not, with the times: the facts
    (`fleet.json`'s `sources`) and the sentence the page puts at its top when anything is not
    live (`note`, None when everything is)."""
    live_providers = sorted({r.provider for r in checked_path} - set(from_tick))
    # a check that failed with no box checked now: nothing on the page is "checked now"
    failed = bool(check_error) and not any(
        b["standing"] and b["verdict_from"] == "live" and b["checked_at"] for b in boxes)
    if failed:
        live_providers = []
    if failed and not from_tick:
        standing_from = "unknown"
    elif not from_tick:
        standing_from = "live"
    elif live_providers:
        standing_from = "mixed"
    else:
        standing_from = "last_tick" if tick is not None else "unknown"
    owed_from = "loop" if not from_tick else ("last_tick" if tick is not None else "unknown")
    tick_facts = None
    if tick is not None:
        age = tick.age_s(now)
        tick_facts = {"number": tick.number, "at": tick.at, "age_s": round(age, 1),
                      "stale": tick.stale(now, cfg.loop.interval_s),
                      "stale_after_s": STALE_INTERVALS * cfg.loop.interval_s}
    from_bills = money["spent_from_bills"]
    live = ["registry"]
    if any(b["job"] is not None for b in boxes):
        live.append("oneshot_verdicts")
    if standing_from in ("live", "mixed"):
        live.append("standing_verdicts")
    last = [] if tick is None else ["standing_verdicts", "owed"]
    return {
        "live": live,
        "from_last_tick": last,
        "registry": {"from": "live", "at": iso(now)},
        "standing_verdicts": {"from": standing_from, "live_providers": live_providers,
                              "last_tick_providers": from_tick},
        "owed": {"from": owed_from, "at": tick.at if owed_from == "last_tick" and tick
                 else None},
        "money": {"from": "bills" if from_bills["boxes"] else "estimate", "bills_at": bills_at,
                  "boxes_from_bills": from_bills["boxes"], "of": from_bills["of"]},
        "keys_missing": keyless,
        "last_tick": tick_facts,
        "note": _note(now, from_tick, live_providers, tick_facts, money, bills_at,
                      any(b["job"] is not None for b in boxes)) if from_tick else (
            f"The standing boxes could not be checked now ({check_error}): their verdicts "
            "are unknown." if failed else None),
    }


def _note(now: datetime, from_tick: list[str], live_providers: list[str],
          tick: Mapping[str, Any] | None, money: Mapping[str, Any], bills_at: str | None,
          oneshots: bool) -> str:
    """The page's top line when a provider's key is missing: what is from the loop's last tick
    (with its time and age), what is read now, and where the money comes from."""
    keys = ", ".join(KEY_ENV.get(p, p) for p in from_tick)
    if live_providers:
        head = f"No {' or '.join(from_tick)} key here ({keys})"
        what = (f"the verdicts of {' and '.join(from_tick)}'s standing boxes and the owed boxes")
    else:
        head = f"No provider key{'s' if len(from_tick) > 1 else ''} here ({keys})"
        what = "the standing boxes' verdicts and the owed boxes"
    if tick is None:
        out = f"{head} and no loop tick on record: {what} are unknown"
    else:
        out = (f"{head}: {what} are from the loop's last tick (tick {tick['number']}, "
               f"{day_time(tick['at'])}, {age_words(tick['age_s'])}), not checked now")
    if live_providers:
        out += f"; {' and '.join(live_providers)}'s standing boxes are checked now"
    out += f"; {_money_source(now, money, bills_at)}; "
    out += "the registry is read now" + ("" if not oneshots else
                                         " and the one-shot boxes watched now") + "."
    if tick is not None and tick["stale"]:
        if tick["age_s"] < 0:
            out += " That tick's time is ahead of this clock: it cannot be trusted."
        else:
            out += (f" That tick is stale: older than {STALE_INTERVALS} loop intervals "
                    f"({duration(tick['stale_after_s'])}); is the loop running?")
    return out


def _money_source(now: datetime, money: Mapping[str, Any], bills_at: str | None) -> str:
    """Where the page's money comes from, in words: the cached bills (with their time) or the
    registry's prices, and why the bills count for nothing when they do."""
    read = read_iso(bills_at)
    if read is None:
        return "money estimated from the registry's prices (no cached bills)"
    when = day_time(bills_at or "", now)
    n, of = money["spent_from_bills"]["boxes"], money["spent_from_bills"]["of"]
    age = (now - read).total_seconds()
    if not 0 <= age <= MAX_AGE_S or utc_day(read) != utc_day(now):
        return (f"money estimated from the registry's prices (the cached bills of {when} are "
                "too old to count)")
    if n == of:
        return f"money from the cached bills of {when}"
    return (f"money from the cached bills of {when} for {n} of {of} boxes, the rest "
            "estimated from their prices")


def verdicts_from(data: Mapping[str, Any]) -> str:
    """Where the page's standing verdicts come from, in a few words (the CLI's summary)."""
    src = data["sources"]
    sv, tick = src["standing_verdicts"], src["last_tick"]
    if sv["from"] == "live":
        return "checked now"
    if sv["from"] == "unknown" and not sv["last_tick_providers"]:
        return "unknown (the check failed)"
    if tick is None:
        said = "unknown (no tick on record)"
    else:
        said = (f"last tick {tick['number']} ({day_time(tick['at'])}, {age_words(tick['age_s'])}"
                f"{', STALE' if tick['stale'] else ''})")
    if sv["from"] == "mixed":
        return (f"{', '.join(sv['live_providers'])} checked now; "
                f"{', '.join(sv['last_tick_providers'])} {said}")
    return said


def _hours(since: str | None, now: datetime) -> float | None:
    t = read_iso(since)
    return None if t is None else round(max(0.0, (now - t).total_seconds()) / 3600, 2)


def _common(r: Row, standing: bool, now: datetime) -> dict[str, Any]:
    # the allow-list: nothing else of a row ever reaches the page
    return {"label": r.label, "role": r.role, "kind": r.kind, "standing": standing,
            "card": r.card, "gpus": r.gpu_count, "provider": r.provider, "status": r.status,
            "uptime_h": _hours(r.created_at, now), "usd_per_hour": r.usd_per_hour}


def _standing_box(r: Row, standing: bool, h: Health | None, checked: str, unchecked: str,
                  source: str, now: datetime, scrub: Scrubber) -> dict[str, Any]:
    """A box `fleet check` judges: its verdict from `h` (checked at `checked`, from `source`:
    one of VERDICT_SOURCES), or unknown with `unchecked` (why there is no verdict) when `h`
    is None."""
    box = _common(r, standing, now)
    if h is None:
        why = unchecked
        box.update(synced=None, blocks=None, peers={"in": None, "out": None,
                                                    "star_only": None, "port_owed": None},
                   disk=disk_of(None),
                   release={"running": None, "wanted": r.node_sha16_wanted, "state": "unknown"},
                   behind=None, checked_at=None, verdict="unknown", verdict_from=source,
                   problems=[scrub(why)],
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
               peers={"in": h.peers_in, "out": h.peers_out, "star_only": h.star_only,
                      "port_owed": scrub(h.port_owed) if h.port_owed else None},
               disk=disk_of(h),
               release={"running": h.node_sha16,
                        "wanted": h.wanted_sha16 or r.node_sha16_wanted, "state": state},
               behind={"current": False, "ahead": False, "behind": True, "other": True}.get(state),
               checked_at=checked, verdict=verdict, verdict_from=source,
               problems=[scrub(p) for p in h.problems],
               job=None)
    return box


def _tick_box(r: Row, standing: bool, tick: LastTick | None, now: datetime,
              scrub: Scrubber) -> dict[str, Any]:
    """A box whose provider has no key here: the verdict the loop's last tick gave it, dated
    by that tick (never by now), or unknown when the tick did not check it or there is none."""
    if tick is None:
        why = f"not checked: no {r.provider} key here, and no loop tick on record"
        return _standing_box(r, standing, None, "", why, "none", now, scrub)
    why = f"not checked in the loop's last tick (tick {tick.number})"
    if tick.provider_errors:
        why += ": " + "; ".join(tick.provider_errors)
    h = tick.verdict(r.label)
    stale = _not_this_box(r, h, tick.at)
    if stale:
        h, why = None, f"the loop's last tick (tick {tick.number}) {stale}"
    return _standing_box(r, standing, h, tick.at, why, "last_tick", now, scrub)


def _not_this_box(r: Row, h: Health | None, at: str) -> str | None:
    """Why a tick's verdict under `r`'s label cannot be this box's (it is then unknown): the
    tick judged another provider's box, or ran before this box was rented or before the
    registry saw it stop. None when it may stand."""
    if h is None:
        return None
    tick_at = read_iso(at)
    created, stopped = read_iso(r.created_at), read_iso(r.stopped_at)
    if h.provider != r.provider:
        return f"judged a {h.provider} box under this label, not this {r.provider} one"
    if tick_at is None or (created is not None and created > tick_at):
        return "ran before this box was rented"
    if stopped is not None and stopped > tick_at:
        return "ran before this box was seen stopped"
    return None


def _release_state(h: Health) -> str:
    """current, behind, ahead, other (not the wanted one, order unknown) or unknown."""
    if not h.node_sha16 or not h.wanted_sha16:
        return "unknown"
    if h.node_sha16 == h.wanted_sha16:
        return "current"
    for p in h.problems:
        if node_release(p) is ReleaseOrder.BEHIND:
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
    box.update(synced=None, blocks=None, peers=None, disk=None, release=None, behind=None,
               checked_at=at,
               verdict=verdict, verdict_from="live", problems=problems,
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

