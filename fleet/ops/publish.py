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
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

from agent.contract import SWITCH_LOCK_WAIT_S
from fleet.boxes import boxssh
from fleet.boxes.pyinfra_run import Run, run_pyinfra
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
            row: BoxRow | None = None) -> None:
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
    for prog, name in (("miner", releases.MINER_BINARY), ("prover", releases.PROVER_BINARY)):
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


class BoxRow(TypedDict):
    """One box's row of a publish: the read-back table's (the CLI's cells), the record's
    (`table`, and each box's `row`) and `--json`'s (`boxes`), from what the box reported."""

    label: str
    provider: str
    state: str
    note: str
    version: str | None
    node_pid: int | None
    node_kind: str | None
    node_path: str | None
    node_sha256: str | None
    node_started_at: str | None
    synced: bool | None
    started_after_pointer: bool | None
    pointer: str | None
    pointer_sha256: str | None
    pointer_written_at: str | None
    miner_sha256: str | None
    miner_version: str | None
    prover_sha256: str | None
    prover_version: str | None
    # the switch to this release, or the revert from it (None where the last was another's)
    switch_applied_at: str | None
    old_exit_at: str | None
    new_started_at: str | None
    synced_at: str | None
    synced_after_s: float | None
    gap_s: float | None
    downtime_s: float | None
    problems: list[str]
    matches_manifest: bool


def table_row(label: str, provider: str, state: str, note: str, rb: Readback | None,
              release: releases.Release, known: Sequence[releases.Release]) -> BoxRow:
    """One box's row (`BoxRow`), from what the box reported."""
    rb = rb or {}
    node = rb.get("node") or {}
    ptr = rb.get("pointer") or {}
    sw = rb.get("switch") or {}
    # the switch to this release, or the revert from it
    ours = release.node_sha16 in (sw.get("to_sha16"), sw.get("from_sha16"))
    miner, prover = rb.get("miner") or {}, rb.get("prover") or {}
    miner_rel = releases.by_file_sha256(known, releases.MINER_BINARY, miner.get("sha256"))
    prover_rel = releases.by_file_sha256(known, releases.PROVER_BINARY, prover.get("sha256"))
    problems = check_row(release, known, rb) if state == "switched" else []
    return {
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
        "miner_sha256": miner.get("sha256"),
        "miner_version": miner_rel.version if miner_rel else None,
        "prover_sha256": prover.get("sha256"),
        "prover_version": prover_rel.version if prover_rel else None,
        "switch_applied_at": sw.get("applied_at") if ours else None,
        "old_exit_at": sw.get("old_exit_at") if ours else None,
        "new_started_at": sw.get("new_started_at") if ours else None,
        "synced_at": sw.get("synced_at") if ours else None,
        "synced_after_s": _secs(sw.get("applied_at"), sw.get("synced_at")) if ours else None,
        # no node process at all: the old one's exit to the new one's start (the agent's own
        # process events); to synced: the agent's first synced reading (one per agent tick)
        "gap_s": _secs(sw.get("old_exit_at"), sw.get("new_started_at")) if ours else None,
        "downtime_s": sw.get("downtime_s") if ours else None,
        "problems": problems,
        "matches_manifest": state == "switched" and not problems,
    }


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
    rows: list[BoxRow]
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
    return _Publish(cfg, hosts, opts, release, known).run()


class Outcome(NamedTuple):
    """One box's outcome in a wave: its state and note, from what it read back after it."""

    label: str
    state: str
    note: str
    readback: Readback | None


class _Publish:
    """One publish under way: the plan, the boxes' rows and the record, step by step.

    Each step after the plan returns why the publish failed (naming the boxes), or None to
    go on; `run` takes the steps in order and records how it ended.
    """

    def __init__(self, cfg: Config, hosts: Hosts, opts: Options, release: releases.Release,
                 known: list[releases.Release]) -> None:
        self.cfg, self.hosts, self.opts = cfg, hosts, opts
        self.release, self.known = release, known
        self.data = dict(hosts)
        self.provider = {n: str(d.get("provider")) for n, d in hosts}
        self.record = Record.load(release.path / RECORD, release.version, release.node_sha16)
        self.labels = [n for n, _ in hosts]
        self.downgrade = set(opts.allow_downgrade)
        self.rows: dict[str, BoxRow] = {}
        self.pending: list[str] = []
        self.switched_so_far: list[str] = []

    def run(self) -> Result:
        opts = self.opts
        waves = self.plan()
        result = Result(self.release, None if opts.dry_run else self.record, [], waves)
        if opts.dry_run:
            for label in self.labels:
                if label in self.pending:
                    self.rows[label]["state"] = "untouched"
            return self.finish(result, None)
        self.begin(waves)
        failure = (self.canary_failure() or self.stage() or self.switch(waves, result)
                   or self.leftover())
        return self.finish(result, failure)

    def row(self, label: str, state: str, note: str, rb: Readback | None) -> BoxRow:
        return table_row(label, self.provider[label], state, note, rb, self.release, self.known)

    # --- the plan: every box read back, the pending ones cut into waves

    def plan(self) -> list[list[str]]:
        release, hosts = self.release, self.hosts
        log.info("publish %s (%s): reading back %d boxes", release.version, release.node_sha16,
                 len(hosts))
        why: dict[str, str] = {}
        seen = read_back(hosts, why)
        for label in self.labels:
            state, note, switch = preflight(release, self.known, seen[label],
                                            label in self.downgrade)
            if state == "unreachable" and label in why:
                note = f"SSH did not answer ({why[label]})"
            if switch:
                self.pending.append(label)
                note = f"pending: {note}"
                state = self.record.state(label)
            self.rows[label] = self.row(label, state, note, seen[label])
        return split_waves(order(self.pending, self.opts.canary), self.opts.waves)

    def begin(self, waves: list[list[str]]) -> None:
        """The run and every box's state before anything changes, in the record."""
        opts, record, rows = self.opts, self.record, self.rows
        record.data["runs"].append({"started_at": now_iso(), "finished_at": None,
                                    "failure": None, "waves": waves, "options": {
                                        "role": opts.role, "canary": opts.canary,
                                        "waves": opts.waves, "soak_s": opts.soak_s,
                                        "allow_downgrade": list(opts.allow_downgrade),
                                        "stable_s": opts.stable_s,
                                        "deadline_s": opts.deadline_s}})
        for label in self.labels:
            if label not in self.pending:
                record.set(label, rows[label]["state"], rows[label]["note"], row=rows[label])
            else:
                record.ensure(label)
        _want(self.cfg, [x for x in self.labels if rows[x]["state"] == "switched"],
              self.release)
        record.save()

    def canary_failure(self) -> str | None:
        canary, rows = self.opts.canary, self.rows
        if canary and canary in rows and rows[canary]["state"] in ("unreachable", "failed"):
            return (f"canary {canary} is {rows[canary]['state']} "
                    f"({rows[canary]['note']}); no box was switched")
        return None

    # --- staging, then the switch wave by wave

    def stage(self) -> str | None:
        """The release's files on every pending box, before any box switches."""
        cfg, release, pending = self.cfg, self.release, self.pending
        if not pending:
            return None
        log.info("staging %s on %d boxes: %s", release.version, len(pending), ", ".join(pending))
        # no limit, as the upload of the release to every pending box takes what the uplink
        # allows; a person watches the publish
        run = run_pyinfra(cfg, pending, {"release": release.version, "stage_only": "1"},
                          fail_fast=False)
        staged = {h for h, r in run.results.items() if r.get("staged")}
        failed = [x for x in pending if x not in staged]
        if not failed and run.rc == 0:
            return None
        for label in failed:
            said = "; ".join(run.errors_for(label)) or "staging did not finish"
            note = f"staging failed: {said}"
            self.record.set(label, "failed", note)
            self.rows[label]["state"], self.rows[label]["note"] = "failed", note
        self.record.save()
        names = ", ".join(failed) or "(pyinfra failed; see its output)"
        return f"staging failed on {names}; no box was switched"

    def switch(self, waves: list[list[str]], result: Result) -> str | None:
        for i in range(1, len(waves) + 1):
            failure = self.wave(i, waves, result)
            if failure is None and self.opts.soak_s > 0 and i < len(waves):
                failure = self.soak(i)
            if failure is not None:
                return failure
        return None

    def wave(self, i: int, waves: list[list[str]], result: Result) -> str | None:
        """Wave `i` switched (one pyinfra run), read back and recorded box by box."""
        cfg, release, record, wave = self.cfg, self.release, self.record, waves[i - 1]
        log.info("wave %d/%d: %s", i, len(waves), ", ".join(wave))
        _want(cfg, wave, release)
        for label in wave:
            record.set(label, record.state(label), f"switching in wave {i}", wave=i)
        record.save()
        # each box's switch may wait for another switch's lock, then deadline_s for its
        # node's health, then, where it failed, deadline_s more for the revert
        run = run_pyinfra(cfg, wave, self.wave_data(wave),
                          timeout_s=cfg.loop.converge_timeout_s + SWITCH_LOCK_WAIT_S
                          + 2 * self.opts.deadline_s)
        not_ok = []
        for o in self.outcomes(wave, run):
            if o.state not in DONE:
                not_ok.append(o.label)
            elif o.state == "switched":
                result.switched_now.append(o.label)
                self.switched_so_far.append(o.label)
            self.rows[o.label] = self.row(o.label, o.state, o.note, o.readback)
            record.set(o.label, o.state, o.note, wave=i, row=self.rows[o.label])
        record.save()
        if not_ok:
            what = ", ".join(f"{x} ({self.rows[x]['state']}: {self.rows[x]['note']})"
                             for x in not_ok)
            left = [x for w in waves[i:] for x in w]
            tail = f"; no further wave started ({len(left)} boxes left)" if left else ""
            return f"wave {i} failed on {what}{tail}"
        if run.rc != 0:
            return (f"wave {i}: pyinfra failed (exit {run.rc}) although every box "
                    "reads back switched; see its output")
        return None

    def wave_data(self, wave: list[str]) -> dict[str, str]:
        """The deploy's data for a wave: switch only, the health window, who may go back."""
        opts = self.opts
        data = {"release": self.release.version, "switch_only": "1",
                "stable_s": str(opts.stable_s), "deadline_s": str(opts.deadline_s)}
        allowed = [x for x in wave if x in self.downgrade]
        if allowed:
            data["allow_downgrade"] = ",".join(allowed)
        return data

    def outcomes(self, wave: list[str], run: Run) -> list[Outcome]:
        """Each box of a wave read back after it; a failed box's note ends with what
        pyinfra said last about it."""
        after = read_back([(x, self.data[x]) for x in wave])
        out = []
        for label in wave:
            state, note = classify(self.release, self.known, after[label])
            extra = run.errors_for(label) if state == "failed" else []
            if extra:
                note = f"{note}; {extra[-1]}" if note else extra[-1]
            out.append(Outcome(label, state, note, after[label]))
        return out

    def soak(self, i: int) -> str | None:
        """After the soak, every box switched so far read back again: all still switched."""
        log.info("soaking %g s before wave %d", self.opts.soak_s, i + 1)
        time.sleep(self.opts.soak_s)
        again = read_back([(x, self.data[x]) for x in self.switched_so_far])
        for label in self.switched_so_far:
            state, note = classify(self.release, self.known, again[label])
            self.rows[label] = self.row(label, state, note, again[label])
            if state != "switched":
                self.record.set(label, state, f"after the soak: {note}", row=self.rows[label])
                self.record.save()
                return f"{label} is {state} after the soak ({note}); no further wave started"
        return None

    # --- the end

    def leftover(self) -> str | None:
        """Why the publish is not done although every wave went through: boxes left out."""
        rows = self.rows
        unreachable = [x for x in self.labels if rows[x]["state"] == "unreachable"]
        bad = [x for x in self.labels if rows[x]["state"] not in DONE | {"unreachable"}]
        parts = []
        if unreachable:
            parts.append(f"unreachable: {', '.join(unreachable)} (run the same command again "
                         "once they answer)")
        if bad:
            parts.append("; ".join(f"{x} {rows[x]['state']}: {rows[x]['note']}" for x in bad))
        return "; ".join(parts) or None

    def finish(self, result: Result, failure: str | None) -> Result:
        result.failure = failure
        result.rows = [self.rows[x] for x in self.labels]
        if not self.opts.dry_run:
            record = self.record
            record.data["outcome"] = "failed" if failure else record.outcome(self.labels)
            record.data["failure"] = failure
            record.data["runs"][-1]["finished_at"] = now_iso()
            record.data["runs"][-1]["failure"] = failure
            record.data["table"] = result.rows
            record.save()
        return result


def _want(cfg: Config, labels: Sequence[str], release: releases.Release) -> None:
    """The registry's wanted node follows the publish (written only where it differs)."""
    if not labels:
        return
    with Registry(cfg.registry).transaction() as rows:
        for label in labels:
            row = rows.get(label)
            if row is not None and row.node_sha16_wanted != release.node_sha16:
                row.node_sha16_wanted = release.node_sha16
