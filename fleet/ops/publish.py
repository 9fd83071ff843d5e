"""`fleet publish VERSION`: a node release onto the standing boxes, canary first, in waves.

1. Check the input (the release and its files, waves, canary, boxes allowed to be downgraded):
   a mistake is one `error:` line, exit 2, nothing changed.
2. Read every selected box back (`python -m agent readback`, one SSH command): what the node
   process runs, never the registry. A box already on the release is done; a box running a
   newer release, or a digest the store does not know, is *ahead* and left alone unless
   `--allow-downgrade` names it; a box that does not answer is *unreachable*.
3. Stage the release on every box that will switch, in one pyinfra run of deploys/publish.py
   (`stage_only=1`): files verified by sha256 on the box. A box that fails stops the publish
   before any box switches.
4. Switch wave by wave (one pyinfra run per wave, `--fail-percent 0`, hosts chosen by `--limit`;
   the agent on each box writes the pointer, waits for the new node to stay synced and reverts
   by itself when it does not), read the wave back, check every row against the release's
   manifest; a box not switched stops the publish (no further wave); `--soak` waits between
   waves and reads the switched boxes again.
5. The record, `<store>/<version>/publish.json` (atomic), holds every box's state (untouched,
   switched, ahead, reverted, failed, unreachable) and its read-back row, so the same command
   resumes an interrupted publish and a finished one switches nothing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.boxes import boxssh
from fleet.boxes.pyinfra_run import run_pyinfra
from fleet.core.errors import FleetError, UsageError
from fleet.core.fileutil import write_atomic
from fleet.core.states import PublishState
from fleet.core.times import now_iso, seconds_between
from fleet.state import releases
from fleet.state.registry import Registry

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fleet.core.config import Config

STATES = tuple(PublishState)
DONE = frozenset({"switched", "ahead"})
RECORD = "publish.json"
READBACK_DEADLINE_S = 60.0  # one box's readback command, once SSH has answered

Hosts = list[tuple[str, dict[str, Any]]]
Readback = dict[str, Any]


# --- waves -----------------------------------------------------------------------------------

def parse_waves(spec: str) -> list[int | float | None]:
    """`1,2,25%,rest` -> [1, 2, 0.25, None]: counts, shares of all boxes, the rest (last)."""
    tokens = [t.strip() for t in spec.split(",")]
    out: list[int | float | None] = []
    for i, tok in enumerate(tokens):
        if tok == "rest":
            if i != len(tokens) - 1:
                raise UsageError(f"--waves {spec!r}: 'rest' must be the last wave")
            out.append(None)
        elif tok.endswith("%") and tok[:-1].replace(".", "", 1).isdigit():
            share = float(tok[:-1])
            if not 0 < share <= 100:
                raise UsageError(f"--waves {spec!r}: {tok} is not a share between 0 and 100%")
            out.append(share / 100)
        elif tok.isdigit() and int(tok) > 0:
            out.append(int(tok))
        else:
            raise UsageError(f"--waves {spec!r}: {tok!r} is not a count, a share (25%) or 'rest'")
    return out


def split_waves(boxes: Sequence[str], spec: str) -> list[list[str]]:
    """The boxes, in order, cut into waves; boxes the spec leaves over form a last wave."""
    sizes = parse_waves(spec)
    n, i, out = len(boxes), 0, []
    for size in sizes:
        if i >= n:
            break
        if size is None:
            take = n - i
        elif isinstance(size, float):
            take = max(1, math.ceil(n * size))
        else:
            take = size
        out.append(list(boxes[i:i + take]))
        i += take
    if i < n:
        out.append(list(boxes[i:]))
    return out


def order(labels: Sequence[str], canary: str | None) -> list[str]:
    """The canary first, then the others by label: the same order on every run."""
    rest = sorted(x for x in labels if x != canary)
    head = [canary] if canary is not None and canary in labels else []
    return head + rest


# --- the record ------------------------------------------------------------------------------

def next_state(old: str, new: str) -> str:
    """A box's state moves anywhere but back to untouched (a touched box stays touched)."""
    if new not in STATES or old not in STATES:
        raise ValueError(f"unknown state {new if new not in STATES else old!r}")
    if new == "untouched" and old != "untouched":
        raise ValueError(f"a {old} box cannot become untouched again")
    return new


class Record:
    """`<store>/<version>/publish.json`: every box's state, written atomically at each step."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def load(cls, path: Path, version: str, node_sha16: str) -> Record:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            data = None
        except ValueError as e:
            raise FleetError(f"{path}: not valid JSON ({e}); move it aside to start over") \
                from None
        if not isinstance(data, dict) or data.get("node_sha16") != node_sha16:
            data = {"schema": 1, "version": version, "node_sha16": node_sha16,
                    "created_at": now_iso(), "updated_at": None, "outcome": None,
                    "runs": [], "boxes": {}}
        return cls(path, data)

    @property
    def boxes(self) -> dict[str, dict[str, Any]]:
        b: dict[str, dict[str, Any]] = self.data["boxes"]
        return b

    def state(self, label: str) -> str:
        return str(self.boxes.get(label, {}).get("state", "untouched"))

    def ensure(self, label: str) -> None:
        self.boxes.setdefault(label, {"state": "untouched", "note": "", "wave": None,
                                      "updated_at": now_iso(), "history": [], "row": None})

    def set(self, label: str, state: str, note: str = "", *, wave: int | None = None,
            row: dict[str, Any] | None = None) -> None:
        self.ensure(label)
        box = self.boxes[label]
        box["state"] = next_state(box["state"], state)
        box["note"] = note
        if wave is not None:
            box["wave"] = wave
        if row is not None:
            box["row"] = row
        box["updated_at"] = now_iso()
        if not box["history"] or box["history"][-1][1:] != [state, note]:
            box["history"].append([box["updated_at"], state, note])

    def outcome(self, labels: Sequence[str]) -> str:
        return "done" if all(self.state(x) in DONE for x in labels) else "incomplete"

    def save(self) -> None:
        self.data["updated_at"] = now_iso()
        write_atomic(self.path, json.dumps(self.data, indent=1) + "\n")


# --- reading a box back ----------------------------------------------------------------------

def _secs(a: Any, b: Any) -> float | None:
    s = seconds_between(a, b)
    return None if s is None else round(s, 2)


def _short(sha: Any) -> str:
    return str(sha)[:16] if sha else "-"


def check_row(release: releases.Release, known: Sequence[releases.Release],
              rb: Readback) -> list[str]:
    """What in a box's read-back does not match the release's manifest (empty: all matches).

    The node: the digest of what its process executes, the version its RPC reports, synced,
    started after the pointer was written, the pointer and its target. Miner and prover run
    from the release the box was converted with (agent.toml): each must be a file of a
    release in the store.
    """
    problems = []
    node = rb.get("node")
    if not node:
        return ["node: not running"]
    sha = node.get("sha256")
    if sha != release.node_sha256:
        other = releases.by_node_sha256(known, sha)
        problems.append(f"node: runs {_short(sha)} ({other.version if other else 'unknown'}), "
                        f"not {release.node_sha16}")
    if node.get("version") is None:
        problems.append("node: its status RPC did not answer")
    elif node.get("version") != release.version:
        problems.append(f"node: reports version {node.get('version')}, not {release.version}")
    if node.get("synced") is not True:
        problems.append("node: not synced")
    if rb.get("started_after_pointer") is not True:
        problems.append("node: did not start after the pointer was written")
    ptr = rb.get("pointer")
    if not ptr:
        problems.append("pointer: absent")
    else:
        if ptr.get("target_sha256") != release.node_sha256:
            problems.append(f"pointer: target {ptr.get('target')} has digest "
                            f"{_short(ptr.get('target_sha256'))}, not {release.node_sha16}")
        if ptr.get("sha256") != release.node_sha256:
            problems.append(f"pointer: digest file says {_short(ptr.get('sha256'))}")
    for prog, name in (("miner", releases.MINER), ("prover", releases.PROVER)):
        p = rb.get(prog)
        if p and p.get("sha256") and releases.by_file_sha256(known, name, p["sha256"]) is None:
            problems.append(f"{prog}: runs {_short(p['sha256'])}, no release has it")
    return problems


def preflight(release: releases.Release, known: Sequence[releases.Release], rb: Readback | None,
              downgrade: bool) -> tuple[str, str, bool]:
    """(state, note, to switch) of a box before anything is done to it."""
    if rb is None:
        return "unreachable", "SSH did not answer", False
    if not rb:
        return "failed", "no agent answers on the box (convert it first)", False
    node = rb.get("node")
    if not node or not node.get("sha256"):
        return "failed", "no node runs: what it runs cannot be told, so it is not switched", \
            False
    sha = node["sha256"]
    if sha == release.node_sha256:
        problems = check_row(release, known, rb)
        if problems:
            return "failed", "runs the release but: " + "; ".join(problems), False
        return "switched", "runs the release", False
    running = releases.by_node_sha256(known, sha)
    if running is None:
        if downgrade:
            return "untouched", f"runs unknown {_short(sha)}; --allow-downgrade", True
        return "ahead", (f"runs {_short(sha)}, a digest no release in the store has: left "
                         "alone (fail closed)"), False
    if running.key > release.key:
        if downgrade:
            return "untouched", f"runs {running.version}; --allow-downgrade", True
        return "ahead", f"runs {running.version}, newer: left alone", False
    return "untouched", f"runs {running.version}", True


def classify(release: releases.Release, known: Sequence[releases.Release],
             rb: Readback | None) -> tuple[str, str]:
    """(state, note) of a box read back after its wave."""
    if rb is None:
        return "unreachable", "SSH did not answer after the switch"
    if not rb:
        return "failed", "no agent answers on the box"
    node = rb.get("node") or {}
    sha = node.get("sha256")
    if sha == release.node_sha256:
        problems = check_row(release, known, rb)
        return ("switched", "") if not problems else ("failed", "; ".join(problems))
    sw = rb.get("switch") or {}
    ends = {sw.get("to_sha16"), sw.get("from_sha16")}
    if sha and ends == {release.node_sha16, sha[:16]}:  # the switch, or its revert, last
        back = releases.by_node_sha256(known, sha)
        return "reverted", (f"not healthy by the deadline; back on "
                            f"{back.version if back else _short(sha)}, read back running")
    if not sha:
        return "failed", "no node runs after the switch"
    running = releases.by_node_sha256(known, sha)
    if running is None or running.key > release.key:
        return "ahead", f"runs {running.version if running else _short(sha)}: left alone"
    return "failed", f"still runs {running.version} ({_short(sha)})"


def table_row(label: str, provider: str, state: str, note: str, rb: Readback | None,
              release: releases.Release, known: Sequence[releases.Release]) -> dict[str, Any]:
    """One row of the read-back table (and of the record), from what the box reported."""
    rb = rb or {}
    node = rb.get("node") or {}
    ptr = rb.get("pointer") or {}
    sw = rb.get("switch") or {}
    # the switch to this release, or the revert from it
    ours = release.node_sha16 in (sw.get("to_sha16"), sw.get("from_sha16"))
    row: dict[str, Any] = {
        "label": label, "provider": provider, "state": state, "note": note,
        "version": node.get("version"),
        "node_pid": node.get("pid"),
        "node_kind": node.get("exe_kind"),
        "node_path": node.get("path"),
        "node_sha256": node.get("sha256"),
        "node_started_at": node.get("started_at"),
        "synced": node.get("synced"),
        "started_after_pointer": rb.get("started_after_pointer"),
        "pointer": ptr.get("target"),
        "pointer_sha256": ptr.get("target_sha256"),
        "pointer_written_at": ptr.get("written_at"),
    }
    for prog, name in (("miner", releases.MINER), ("prover", releases.PROVER)):
        p = rb.get(prog) or {}
        rel = releases.by_file_sha256(known, name, p.get("sha256"))
        row[f"{prog}_sha256"] = p.get("sha256")
        row[f"{prog}_version"] = rel.version if rel else None
    row.update({
        "switch_applied_at": sw.get("applied_at") if ours else None,
        "old_exit_at": sw.get("old_exit_at") if ours else None,
        "new_started_at": sw.get("new_started_at") if ours else None,
        "synced_at": sw.get("synced_at") if ours else None,
        "synced_after_s": _secs(sw.get("applied_at"), sw.get("synced_at")) if ours else None,
        # no node process at all: the old one's exit to the new one's start (the agent's own
        # process events); to synced: the agent's first synced reading (one per agent tick)
        "gap_s": _secs(sw.get("old_exit_at"), sw.get("new_started_at")) if ours else None,
        "downtime_s": sw.get("downtime_s") if ours else None,
    })
    row["problems"] = check_row(release, known, rb) if state == "switched" else []
    row["matches_manifest"] = state == "switched" and not row["problems"]
    return row


# --- talking to the boxes --------------------------------------------------------------------

def read_back(hosts: Hosts, errors: dict[str, str] | None = None
              ) -> dict[str, Readback | None]:
    """`python -m agent readback` on every host at once (one SSH command each): the
    `NodeReadback` fact's own command and parser, over the host data's SSH settings (the
    fleet's key, the pinned known_hosts, strict). None = the box did not answer; why goes into
    `errors`."""
    from concurrent.futures import ThreadPoolExecutor

    if not hosts:
        return {}
    with ThreadPoolExecutor(min(32, len(hosts))) as pool:
        answers = list(pool.map(lambda h: _read_one(h[1]), hosts))
    out: dict[str, Readback | None] = {}
    for (name, _), (rb, error) in zip(hosts, answers, strict=True):
        out[name] = rb
        if error is not None and errors is not None:
            errors[name] = error
    return out


def _read_one(data: Mapping[str, Any]) -> tuple[Readback | None, str | None]:
    from agent.contract import ROOT
    from facts.box import NodeReadback

    read = boxssh.read_fact(data, NodeReadback(), ROOT, READBACK_DEADLINE_S)
    if read.value is not None:
        return read.value, None
    if read.answered:  # SSH is up; what the box said is not a readback
        return {}, f"readback: {read.error}"
    return None, read.error or "no answer"


# --- the publish -----------------------------------------------------------------------------

@dataclass
class Options:
    version: str
    role: str | None = None
    canary: str | None = None
    waves: str = "1,rest"
    soak_s: float = 0.0
    allow_downgrade: tuple[str, ...] = ()
    stable_s: int = 60
    deadline_s: int = 300
    dry_run: bool = False


@dataclass
class Result:
    release: releases.Release
    record: Record | None
    rows: list[dict[str, Any]]
    waves: list[list[str]] = field(default_factory=list)
    switched_now: list[str] = field(default_factory=list)
    failure: str | None = None  # why the publish failed, naming the boxes

    @property
    def ok(self) -> bool:
        return self.failure is None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.release.version, "node_sha16": self.release.node_sha16,
                "ok": self.ok, "failure": self.failure, "waves": self.waves,
                "switched_now": self.switched_now, "boxes": self.rows,
                "record": str(self.record.path) if self.record else None}


@contextmanager
def _exclusive(store: Path) -> Iterator[None]:
    import fcntl

    store.mkdir(parents=True, exist_ok=True)
    fd = os.open(store / "publish.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FleetError(f"another publish runs from {store}; wait for it") from None
        yield
    finally:
        os.close(fd)


def select(cfg: Config, built_groups: Mapping[str, Hosts], built_down: Sequence[Any],
           opts: Options) -> Hosts:
    """The converted standing boxes the publish covers; bad labels are usage errors."""
    if opts.role is not None:
        cfg.role(opts.role)
    hosts = [(n, d) for n, d in built_groups.get("standing", [])
             if d.get("standing") and (opts.role is None or d.get("role") == opts.role)]
    names = {n for n, _ in hosts}
    reg = Registry(cfg.registry)
    for what, label in [("--canary", opts.canary)] + [("--allow-downgrade", x)
                                                      for x in opts.allow_downgrade]:
        if label is None or label in names:
            continue
        row = reg.get(label)
        down = {r.label: s for r, s in built_down}
        if row is None or not row.live:
            why = "no such box in the registry" if row is None else f"the box is {row.status}"
        elif label in down:
            why = f"its provider reports it {down[label]}"
        elif not row.standing:
            why = "it is not a converted standing box"
        else:
            why = f"it is not in role {opts.role}"
        raise UsageError(f"{what} {label}: {why}")
    if not hosts:
        raise UsageError("no converted standing boxes to publish to"
                         + (f" in role {opts.role}" if opts.role else ""))
    return hosts


def publish(cfg: Config, hosts: Hosts, opts: Options) -> Result:
    """Drive the publish (see the module's docstring); `hosts` comes from `select`."""
    release = releases.find(cfg.releases, opts.version)
    releases.check_usable(release)
    known = releases.load(cfg.releases)
    parse_waves(opts.waves)
    if opts.stable_s < 0 or opts.deadline_s <= opts.stable_s or opts.soak_s < 0:
        raise UsageError("need 0 <= --stable-s < --deadline-s and --soak >= 0")
    with _exclusive(cfg.releases):
        return _publish(cfg, hosts, opts, release, known)


def _publish(cfg: Config, hosts: Hosts, opts: Options, release: releases.Release,
             known: list[releases.Release]) -> Result:
    data = dict(hosts)
    provider = {n: str(d.get("provider")) for n, d in hosts}
    record = Record.load(release.path / RECORD, release.version, release.node_sha16)
    labels = [n for n, _ in hosts]
    downgrade = set(opts.allow_downgrade)
    log.info("publish %s (%s): reading back %d boxes", release.version, release.node_sha16,
             len(hosts))
    why: dict[str, str] = {}
    seen = read_back(hosts, why)
    rows: dict[str, dict[str, Any]] = {}
    pending = []
    for label in labels:
        state, note, switch = preflight(release, known, seen[label], label in downgrade)
        if state == "unreachable" and label in why:
            note = f"SSH did not answer ({why[label]})"
        if switch:
            pending.append(label)
            note = f"pending: {note}"
            state = record.state(label)
        rows[label] = table_row(label, provider[label], state, note, seen[label], release,
                                known)
    waves = split_waves(order(pending, opts.canary), opts.waves)
    result = Result(release, None if opts.dry_run else record, [], waves)

    def finish(failure: str | None) -> Result:
        result.failure = failure
        result.rows = [rows[x] for x in labels]
        if not opts.dry_run:
            record.data["outcome"] = "failed" if failure else record.outcome(labels)
            record.data["failure"] = failure
            record.data["runs"][-1]["finished_at"] = now_iso()
            record.data["runs"][-1]["failure"] = failure
            record.data["table"] = result.rows
            record.save()
        return result

    if opts.dry_run:
        for label in labels:
            rows[label]["state"] = rows[label]["state"] if label not in pending else "untouched"
        return finish(None)

    record.data["runs"].append({"started_at": now_iso(), "finished_at": None, "failure": None,
                                "waves": waves, "options": {
                                    "role": opts.role, "canary": opts.canary,
                                    "waves": opts.waves, "soak_s": opts.soak_s,
                                    "allow_downgrade": list(opts.allow_downgrade),
                                    "stable_s": opts.stable_s, "deadline_s": opts.deadline_s}})
    for label in labels:
        if label not in pending:
            record.set(label, rows[label]["state"], rows[label]["note"], row=rows[label])
        else:
            record.ensure(label)
    _want(cfg, [x for x in labels if rows[x]["state"] == "switched"], release)
    record.save()

    unreachable = [x for x in labels if rows[x]["state"] == "unreachable"]
    bad = [x for x in labels if rows[x]["state"] == "failed"]
    if opts.canary and opts.canary in unreachable + bad:
        return finish(f"canary {opts.canary} is {rows[opts.canary]['state']} "
                      f"({rows[opts.canary]['note']}); no box was switched")

    if pending:
        log.info("staging %s on %d boxes: %s", release.version, len(pending), ", ".join(pending))
        run = run_pyinfra(cfg, pending, {"release": release.version, "stage_only": "1"},
                          fail_fast=False, timeout_s=cfg.loop.converge_timeout_s)
        staged = {h for h, r in run.results.items() if r.get("staged")}
        failed = [x for x in pending if x not in staged]
        if failed or run.rc != 0:
            for label in failed:
                said = "; ".join(run.errors_for(label)) or "staging did not finish"
                note = f"staging failed: {said}"
                record.set(label, "failed", note)
                rows[label].update(state="failed", note=note)
            record.save()
            names = ", ".join(failed) or "(pyinfra failed; see its output)"
            return finish(f"staging failed on {names}; no box was switched")

    switched_so_far: list[str] = []
    for i, wave in enumerate(waves, start=1):
        log.info("wave %d/%d: %s", i, len(waves), ", ".join(wave))
        _want(cfg, wave, release)
        for label in wave:
            record.set(label, record.state(label), f"switching in wave {i}", wave=i)
        record.save()
        wave_data = {"release": release.version, "switch_only": "1",
                     "stable_s": str(opts.stable_s), "deadline_s": str(opts.deadline_s)}
        allowed = [x for x in wave if x in downgrade]
        if allowed:
            wave_data["allow_downgrade"] = ",".join(allowed)
        # each box's switch waits up to deadline_s for its node's health
        run = run_pyinfra(cfg, wave, wave_data,
                          timeout_s=cfg.loop.converge_timeout_s + opts.deadline_s)
        after = read_back([(x, data[x]) for x in wave])
        not_ok = []
        for label in wave:
            state, note = classify(release, known, after[label])
            if state not in DONE:
                extra = run.errors_for(label)
                if extra and state == "failed":
                    note = f"{note}; {extra[-1]}" if note else extra[-1]
                not_ok.append(label)
            elif state == "switched":
                result.switched_now.append(label)
                switched_so_far.append(label)
            rows[label] = table_row(label, provider[label], state, note, after[label],
                                    release, known)
            record.set(label, state, note, wave=i, row=rows[label])
        record.save()
        if not_ok:
            what = ", ".join(f"{x} ({rows[x]['state']}: {rows[x]['note']})" for x in not_ok)
            left = [x for w in waves[i:] for x in w]
            tail = f"; no further wave started ({len(left)} boxes left)" if left else ""
            return finish(f"wave {i} failed on {what}{tail}")
        if run.rc != 0:
            return finish(f"wave {i}: pyinfra failed (exit {run.rc}) although every box "
                          "reads back switched; see its output")
        if opts.soak_s > 0 and i < len(waves):
            log.info("soaking %g s before wave %d", opts.soak_s, i + 1)
            time.sleep(opts.soak_s)
            again = read_back([(x, data[x]) for x in switched_so_far])
            for label in switched_so_far:
                state, note = classify(release, known, again[label])
                rows[label] = table_row(label, provider[label], state, note, again[label],
                                        release, known)
                if state != "switched":
                    record.set(label, state, f"after the soak: {note}", row=rows[label])
                    record.save()
                    return finish(f"{label} is {state} after the soak ({note}); no further "
                                  "wave started")
    unreachable = [x for x in labels if rows[x]["state"] == "unreachable"]
    bad = [x for x in labels if rows[x]["state"] not in DONE | {"unreachable"}]
    if unreachable or bad:
        parts = []
        if unreachable:
            parts.append(f"unreachable: {', '.join(unreachable)} (run the same command again "
                         "once they answer)")
        if bad:
            parts.append("; ".join(f"{x} {rows[x]['state']}: {rows[x]['note']}" for x in bad))
        return finish("; ".join(parts))
    return finish(None)


def _want(cfg: Config, labels: Sequence[str], release: releases.Release) -> None:
    """The registry's wanted node follows the publish (written only where it differs)."""
    if not labels:
        return
    with Registry(cfg.registry).transaction() as rows:
        for label in labels:
            row = rows.get(label)
            if row is not None and row.node_sha16_wanted != release.node_sha16:
                row.node_sha16_wanted = release.node_sha16


# --- the table -------------------------------------------------------------------------------

COLUMNS = ("box", "state", "version", "node sha16 (of)", "after pointer", "miner", "prover",
           "pointer", "synced after", "down: exit→up / →synced", "manifest")


def cells(row: dict[str, Any]) -> list[str]:
    """One row as the operator reads it."""
    def yes(v: Any) -> str:
        return "-" if v is None else ("yes" if v else "NO")

    def prog(p: str) -> str:
        sha = row.get(f"{p}_sha256")
        return f"{_short(sha)} ({row.get(f'{p}_version') or 'unknown'})" if sha else "-"

    def secs(v: Any) -> str:
        return "-" if v is None else f"{float(v):.2f} s"

    kind = row.get("node_kind") or "?"
    node = f"{_short(row.get('node_sha256'))} ({kind})" if row.get("node_sha256") else "-"
    ptr = row.get("pointer") or "-"
    if ptr != "-":
        ptr = "/".join(ptr.rsplit("/", 3)[-3:-1]) if ptr.count("/") >= 2 else ptr
    state = row["state"] + (f": {row['note']}" if row.get("note") and row["state"] != "switched"
                            else "")
    if row["state"] == "switched":
        check = "ok" if row.get("matches_manifest") else "MISMATCH: " + "; ".join(
            row.get("problems") or [])
    else:
        check = "-"
    return [row["label"], state, row.get("version") or "-", node,
            yes(row.get("started_after_pointer")), prog("miner"), prog("prover"), ptr,
            secs(row.get("synced_after_s")),
            f"{secs(row.get('gap_s'))} / {secs(row.get('downtime_s'))}"
            if row.get("gap_s") is not None else "-", check]
