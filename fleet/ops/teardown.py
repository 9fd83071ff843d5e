"""Teardown of a one-shot box: its outputs read back twice before the meter stops.

1. On the box: the job's state.
2. The outputs pulled to the local archive as one tar stream (`python -m agent manifest
   --tar`): each file read once on the box and hashed there as it is sent, the box's sha256
   manifest last; hashed again here while written, and compared with that manifest.
3. Pushed to the store in one commit (manifest included, parent commit pinned), then read back
   at that commit from a fresh cache: sizes and hashes, then the bytes, hashed.
4. On the box again, sizes and mtimes against the manifest it saved: a file written after it
   was read keeps the box (no byte is read twice). The archive is fsynced (the kernel wrote
   most of it back during step 3).
5. Only then destroyed through the provider; the row is marked destroyed once the provider no
   longer lists the box.

The teardown trusts the registry row alone for what it reads: the outputs folder is the one
the operator's job file named when the job was placed (`outputs` on the row), never the box's
`job.json`, which the job can rewrite. A row that names none (written before rows recorded it)
and an outputs folder missing on the box (the agent makes it for every job that ended) keep
the box: neither is "zero outputs". The pull has an overall deadline (PULL_DEADLINE_S).

Any mismatch keeps the box, and is raised as a `KeptBox` naming each file that differs and
where; every failure of the read (an SSH error, the store down, the archive's disk) keeps it
too, and each records why on its row (`teardown`), which `fleet check` shows on every pass.
A box kept for a reason that lasts until someone changes the outputs or the row (a link, a
name the store cannot hold, no outputs folder) is marked (`kept_lasting`): `teardown
--expired` does not pull it again; a teardown by label, once it is fixed, does.

A destroy that fails leaves the row live with the store commit recorded; the next teardown
reads back at that commit (and pushes anew when the box's outputs no longer match it) and
destroys.

A job is never read while it may still write: a running job is left alone until the box's
own deadline (its `started_at` plus the job's TTL), then stopped on the box (TERM, then KILL)
and read once its end is recorded; a job that never reached its run is closed first, so that
no step starts after the read. One teardown of a label runs at a time (a lock per label,
held from the first read to the destroy), and the row is read again before each step.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NoReturn

from agent.contract import JOB_STOP, JOBS, ROOT, TERMINAL, VENV_PYTHON, job_workdir, stop_document
from fleet.boxes import boxssh, jobstate, lifecycle
from fleet.core import fileutil
from fleet.core.boxes import Row, is_standing, unread
from fleet.core.errors import FleetError, ProviderError, UsageError
from fleet.core.times import parse_iso
from fleet.ops import destroy
from fleet.state import archive

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fleet.core.config import Config
    from fleet.providers.base import Provider
    from fleet.state.registry import Registry


class KeptBox(FleetError):
    """The outputs could not be verified: the box is kept (it still bills) and says why.

    `reason` is what the row's `teardown` note says (default: the message); `lasting`, that
    it stays true until someone changes the box's outputs or the row (`kept_lasting`)."""

    def __init__(self, message: str, reason: str | None = None, lasting: bool = False) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.lasting = lasting


@dataclass
class Outcome:
    label: str
    job: str | None
    phase: str | None = None
    files: int = 0
    bytes: int = 0
    commit: str | None = None
    destroyed: bool = False
    dry_run: bool = False
    steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _remote_job(cfg: Config, row: Row, job: str) -> dict[str, Any]:
    """job.json and state.json of the box's job, in one SSH round trip; unreadable keeps the
    box."""
    try:
        return jobstate.read_job(cfg, row, job)
    except FleetError as e:
        raise KeptBox(f"{e}; box kept") from None


def _manifest(cfg: Config, row: Row, outputs: str) -> list[dict[str, Any]]:
    res = boxssh.run(cfg, row, _in_folder(outputs, _agent_manifest(outputs)), timeout=3600)
    if res.returncode == NO_FOLDER:
        _no_folder(row, outputs)
    if res.returncode != 0:
        raise KeptBox(f"{row.label}: the box could not make its outputs' manifest "
                      f"({res.stderr.strip()[-200:]}); box kept")
    data = json.loads(res.stdout)
    if not isinstance(data, list):
        raise KeptBox(f"{row.label}: the box's manifest is not a list; box kept")
    return data


PULL_DEADLINE_S = 4 * 3600.0  # the whole pull: past it, ssh is killed and the box kept


def _pull(cfg: Config, row: Row, outputs: str, job: str) -> archive.Pulled:
    """The outputs as one tar stream, each file read once on the box and hashed there as it is
    sent, then its manifest (also saved on the box, for `_unchanged`); within PULL_DEADLINE_S
    in all, however the box or the link stalls."""
    proc = boxssh.stream(cfg, row, _in_folder(
        outputs, _agent_manifest(outputs, "--tar", "--save", _saved(job))))
    late = threading.Event()

    def too_late() -> None:
        late.set()
        proc.kill()

    timer = threading.Timer(PULL_DEADLINE_S, too_late)
    timer.daemon = True
    timer.start()
    try:
        try:
            assert proc.stdout is not None
            pulled = archive.pull(proc.stdout, archive_dir(cfg), row.label, job)
        except BaseException:
            # the local side failed mid-stream (a full disk): ssh may be blocked on the full
            # pipe and would never exit by itself
            proc.kill()
            proc.wait()
            if not late.is_set():
                raise
        rc = proc.wait()
    finally:
        timer.cancel()
    if late.is_set():
        raise KeptBox(f"{row.label}: reading the outputs off the box took longer than "
                      f"{PULL_DEADLINE_S:.0f} s, its deadline; stopped, box kept")
    if rc == NO_FOLDER:
        _no_folder(row, outputs)
    if rc != 0:
        raise KeptBox(f"{row.label}: reading the outputs off the box failed "
                      f"({boxssh.stderr_tail(proc.stderr) or f'exit {rc}'}); box kept")
    return pulled


NO_FOLDER = 3  # `_in_folder`'s exit status: the outputs folder is not on the box


def _in_folder(outputs: str, command: str) -> str:
    """`command`, run only where the outputs folder is a folder on the box: a job that ended
    always has one (the agent writes its record there), so a missing one was removed or
    renamed, never "no outputs"."""
    q = shlex.quote(outputs)
    return f"{{ test -d {q} && test ! -L {q}; }} || exit {NO_FOLDER}; {command}"


def _no_folder(row: Row, outputs: str) -> NoReturn:
    raise KeptBox(f"{row.label}: the outputs folder {outputs} is not a folder on the box (the "
                  "job removed or renamed it?); nothing read, box kept",
                  f"no outputs folder {outputs} on the box", lasting=True)


def _agent_manifest(outputs: str, *args: str) -> str:
    """The box's command line for `python -m agent manifest OUTPUTS ARGS...`."""
    return " ".join([f"cd {ROOT} && {VENV_PYTHON} -m agent manifest",
                     *map(shlex.quote, (outputs, *args))])


def _saved(job: str) -> str:
    return f"{ROOT}/{JOBS}/{job}/outputs-manifest.json"


def _unchanged(cfg: Config, row: Row, outputs: str, job: str) -> list[str]:
    """What was written on the box after its outputs were read (sizes and mtimes against the
    saved manifest; no byte is read again)."""
    res = boxssh.run(cfg, row, _agent_manifest(outputs, "--unchanged-since", _saved(job)))
    try:
        problems = json.loads(res.stdout) if res.returncode == 0 else None
    except ValueError:
        problems = None
    if not isinstance(problems, list):
        raise KeptBox(f"{row.label}: cannot tell whether the outputs changed since they were "
                      f"read ({res.stderr.strip()[-200:] or f'exit {res.returncode}'}); box kept")
    return [str(p) for p in problems]


def archive_dir(cfg: Config) -> Path:
    p = Path(cfg.store.get("archive", "state/archive"))
    return p if p.is_absolute() else cfg.path.parent / p


def store_repo(cfg: Config) -> str:
    return cfg.store.get("repo", "fleet/outputs")




def expired(row: Row, now: datetime | None = None) -> bool:
    if not row.expires_at:
        return False
    at = parse_iso(row.expires_at)
    return (now or datetime.now(UTC)) >= at


def _guarded(cfg: Config, reg: Registry, label: str) -> Row:
    """The row, when it may be torn down: a live one-shot box."""
    row = reg.get(label)
    if row is None:
        raise UsageError(f"no box labelled {label!r} in the registry")
    if not row.live:
        raise UsageError(f"{label} is already {row.status}")
    if is_standing(cfg, row):
        raise UsageError(f"{label} is a standing box: teardown is for one-shot boxes only "
                         "(standing boxes are replaced, not torn down)")
    return row


@contextlib.contextmanager
def one_at_a_time(reg: Registry, label: str) -> Iterator[None]:
    """The label's teardown lock, held from the first read to the destroy: a second teardown
    (`fleet run`'s own and a `teardown --expired` from cron) stops at once, changing nothing."""
    try:
        with fileutil.locked(reg.path.parent / "locks" / f"teardown-{label}.lock", wait=False):
            yield
    except BlockingIOError:
        raise FleetError(f"{label}: a teardown of this box is under way; nothing done") \
            from None


UNCHANGED = object()  # `flagged_job`'s default: no expectation of the row's job


def teardown(cfg: Config, reg: Registry, providers: Mapping[str, Provider], label: str,
             dry_run: bool = False, keep_box: bool = False,
             flagged_job: Any = UNCHANGED) -> Outcome:
    """Read the box's job back, then destroy it (with `keep_box`, keep it for another job).

    A dry run writes nothing, here or on the box. `flagged_job` is the job the watchdog
    judged (`teardown --expired`): a row that names another by now is left alone, and so is
    one kept for a lasting reason (`kept_lasting`) until its job changes; a teardown of the
    label by name reads it again."""
    row = _guarded(cfg, reg, label)
    p = providers.get(row.provider)
    if p is None:
        raise UsageError(f"cannot tear {label} down: no {row.provider} API key")
    with one_at_a_time(reg, label):
        row = _guarded(cfg, reg, label)  # as it is now, under the lock
        if flagged_job is not UNCHANGED and row.job != flagged_job:
            raise FleetError(f"{label}: its job is {row.job or 'none'} now, not the "
                             f"{flagged_job or 'none'} the watchdog flagged; left alone")
        if flagged_job is not UNCHANGED and row.job and row.kept_lasting == row.job:
            raise KeptBox(f"{label}: {row.teardown}; not read again until that changes: "
                          f"fix it on the box, then `fleet teardown {label}`")
        out = Outcome(label, row.job, dry_run=dry_run)
        try:
            _read(cfg, reg, p, row, out, dry_run)
        except UsageError:
            raise  # not yet (a job still running) or not this teardown's (destroyed meanwhile)
        except Exception as e:
            if not dry_run:
                _record_keep(reg, label, e)
            raise
        if dry_run:
            out.steps.append(f"would destroy {row.provider} box {row.provider_id}")
            return out
        if keep_box:
            out.steps.append("read back; box kept for another job (--keep-box)")
            return out
        _destroy(cfg, reg, providers, _done(cfg, reg, label, out.job), out)
    return out


def _read(cfg: Config, reg: Registry, p: Provider, row: Row, out: Outcome,
          dry_run: bool) -> None:
    """Everything before the destroy: the host key pinned if need be, the job read back."""
    if not row.host_key and not dry_run:
        row = _pin_if_ready(cfg, reg, p, row)
    if not row.host_key:
        # every deploy reaches the box through its pinned key: nothing ran on it
        out.steps.append("no pinned host key: would pin it if the box is SSH-ready now, "
                         "then read back" if dry_run else
                         "never SSH-ready: nothing to read back")
        if row.job and not dry_run:
            reg.update(row.label, read_back=row.job)
    elif row.job:
        _read_back(cfg, reg, row, out, dry_run)
    else:
        out.steps.append("no job on this box: nothing to read back")


def _record_keep(reg: Registry, label: str, e: Exception) -> None:
    """Why the box is kept, on its row (`fleet check` shows it on every pass): every failure
    of the read, not only a mismatch."""
    if isinstance(e, KeptBox):
        reason, lasting = e.reason, e.lasting
    else:
        reason, lasting = (str(e) if isinstance(e, FleetError) else
                           f"{type(e).__name__}: {e}"), False
    row = reg.get(label)
    if row is not None and row.live:
        reg.update(label, teardown=f"kept: {reason}"[:300],
                   kept_lasting=row.job if lasting else None)


def _done(cfg: Config, reg: Registry, label: str, job: str | None) -> Row:
    """The row, just before its destroy: still live, still naming the job this teardown read
    back, and that job read back."""
    row = _guarded(cfg, reg, label)
    if row.job != job or unread(row):
        raise FleetError(f"{label}: its job changed to {row.job} during the teardown, or was "
                         "not read back; box kept")
    return row


def _close_unstaged(cfg: Config, row: Row, job: str) -> dict[str, Any]:
    """Close a job that has not reached the box yet, so that a deploy still under way can
    never start it after this teardown (the agent refuses every step of a job with a
    `stop.json`), then look again: {} when it is still not staged, else what `_remote_job`
    reads (it was staged meanwhile)."""
    d = shlex.quote(f"{ROOT}/{JOBS}/{job}")
    # the agent's own document (it may not be installed yet: the deploy may not have got so far)
    stop = json.dumps(stop_document(datetime.now(UTC).timestamp(), 0))
    res = boxssh.run(cfg, row, f"mkdir -p {d} && printf '%s' {shlex.quote(stop)} > "
                     f"{d}/{JOB_STOP}.new && mv {d}/{JOB_STOP}.new {d}/{JOB_STOP}")
    if res.returncode != 0:
        raise KeptBox(f"{row.label}: cannot close job {job} on the box "
                      f"({res.stderr.strip()[-200:] or f'exit {res.returncode}'}); box kept")
    return _remote_job(cfg, row, job)


def _pin_if_ready(cfg: Config, reg: Registry, p: Provider, row: Row) -> Row:
    """A box whose rent stopped before it was SSH-ready (`fleet run` timed out, or was
    killed, waiting for it): its host key pinned now when the provider says it is ready, so
    that whatever reached it is read back. One that is not ready was never deployed to."""
    from fleet.boxes.sshkeys import write_known_hosts

    if row.job_state is not None:
        raise KeptBox(f"{row.label}: its job was read on the box, but no host key is pinned; "
                      "box kept")
    box = p.box(row.provider_id) if row.provider_id else None
    if box is None or (key := lifecycle.host_key_if_ready(box)) is None:
        return row
    row = lifecycle.pin(reg, lifecycle.record(reg, row.label, box), key)
    write_known_hosts(cfg.known_hosts, reg.rows())
    return row


def _read_back(cfg: Config, reg: Registry, row: Row, out: Outcome, dry_run: bool) -> None:
    """The job's outputs read back: the job found on the box (or closed there before it
    arrives), ended, then copied to the archive and the store and both copies verified."""
    job = row.job or ""
    if not dry_run:  # what this teardown has not verified yet is not read back
        reg.update(row.label, read_back=None)
    info = _staged(cfg, reg, row, job, out, dry_run)
    if info is None:
        return
    _end(cfg, reg, row, job, info, out, dry_run)
    outputs = _outputs(row, job)
    if dry_run:
        _would_pull(cfg, row, outputs, job, out)
        return
    out.commit = _copied(cfg, reg, row, outputs, job, out)


def _staged(cfg: Config, reg: Registry, row: Row, job: str, out: Outcome,
            dry_run: bool) -> dict[str, Any] | None:
    """What `_remote_job` reads of the job on the box; None when there is nothing to read
    back: a job that never reached the box is closed there first, so that it never runs."""
    info = _remote_job(cfg, row, job)
    if info:
        return info
    if row.job_state is not None or row.invocations:
        raise KeptBox(f"{row.label}: job {job}'s files are gone from the box, though it "
                      f"was seen {row.job_state}; box kept")
    if dry_run:
        out.steps.append(f"job {job} has not reached the box: would close it there")
        return None
    # the deploy stopped before the job was placed: closed on the box, it never runs
    info = _close_unstaged(cfg, row, job)
    if info:
        return info
    out.steps.append(f"job {job} never reached the box: nothing to read back")
    log.info("%s: job %s never reached the box; nothing to read back", row.label, job)
    reg.update(row.label, read_back=job)
    return None


def _end(cfg: Config, reg: Registry, row: Row, job: str, info: dict[str, Any], out: Outcome,
         dry_run: bool) -> None:
    """The job's state on the row, and the job ended on the box before its outputs are read
    (`_ended`; a dry run only says it would)."""
    spec, state = info.get("spec") or {}, info.get("state") or {}
    if not isinstance(state, dict) or not state:
        raise KeptBox(f"{row.label}: the box's agent could not tell job {job}'s state; "
                      "box kept")
    out.phase = state.get("phase") or "new"
    if not dry_run:
        reg.update(row.label, job_state=out.phase, invocations=state.get("invocations"),
                   refusal=_refusal(state))
    if out.phase in TERMINAL:
        return
    if dry_run:
        out.steps.append(f"job {job} is {out.phase}: would stop it on the box first")
    else:
        state = _ended(cfg, reg, row, job, spec, state, info.get("box_now"))
        out.phase = state["phase"]


def _would_pull(cfg: Config, row: Row, outputs: str, job: str, out: Outcome) -> None:
    """A dry run's read: what the box's manifest says would be pulled, pushed and read back."""
    manifest = _manifest(cfg, row, outputs)
    links = [str(e.get("path")) for e in manifest if "size" not in e]
    manifest = [e for e in manifest if "size" in e]
    if links:
        out.steps.append(f"would keep the box: {len(links)} outputs are not files "
                         f"({', '.join(links[:5])})")
    size = sum(int(e["size"]) for e in manifest)
    out.steps.append(f"would pull {len(manifest)} files ({size} bytes) to "
                     f"{archive.folder(archive_dir(cfg), row.label, job)}, push them to "
                     f"{store_repo(cfg)} and read them back")


def _copied(cfg: Config, reg: Registry, row: Row, outputs: str, job: str,
            out: Outcome) -> str:
    """The outputs pulled to the archive and pushed to the store, each copy verified against
    the box's manifest, nothing written on the box since, the archive durable: the row marks
    the job read back; the store's commit."""
    row = _guarded(cfg, reg, row.label)
    pulled = _pull(cfg, row, outputs, job)
    out.files, out.bytes = pulled.files, pulled.bytes
    if pulled.problems:
        _keep(row, pulled.problems, f"archive ({pulled.path.parent})", pulled.lasting)
    log.info("%s: %d files, %d bytes; archive verified against the box's manifest (%s)",
             row.label, len(pulled.manifest), pulled.bytes, pulled.path)
    row = _guarded(cfg, reg, row.label)
    commit = _store_verified(reg, row, store_repo(cfg), job, pulled)
    row = _guarded(cfg, reg, row.label)
    changed = _unchanged(cfg, row, outputs, job)
    if changed:  # a straggler wrote on: both copies are stale, the next teardown pushes anew
        reg.update(row.label, store_commit=None)
        _keep(row, changed, "box (written to after they were read)")
    try:
        archive.make_durable(pulled.path.parent)
    except OSError as e:
        _keep(row, [f"{pulled.path}: cannot be made durable ({e})"], "archive")
    reg.update(row.label, read_back=job, teardown=None, kept_lasting=None)
    return commit


def _store_verified(reg: Registry, row: Row, repo: str, job: str,
                    pulled: archive.Pulled) -> str:
    """The store's commit of the pulled outputs, read back there and matching; a failure of
    the store keeps the box."""
    from fleet.providers import store

    try:
        commit, problems = _stored(reg, row, repo, f"{job}/{row.label}", pulled)
    except store.Unstorable as e:
        raise KeptBox(f"{row.label}: box kept: {e}", str(e), lasting=True) from None
    except (FleetError, OSError) as e:  # the store failed: nothing says the copies differ
        raise KeptBox(f"{row.label}: box kept, the push to the store failed: {e}",
                      f"the push to the store failed: {e}") from None
    if problems:
        _keep(row, problems, f"store {repo} at {commit}")
    log.info("%s: store read back at %s", row.label, commit[:12])
    return commit


def _stored(reg: Registry, row: Row, repo: str, prefix: str,
            pulled: archive.Pulled) -> tuple[str, list[str]]:
    """The store's commit of these outputs and what differs there. A commit recorded by an
    earlier teardown (whose destroy failed) is read back first; when the box's outputs no
    longer match it, they are pushed anew rather than kept forever."""
    from fleet.providers import store

    manifest = pulled.manifest
    commit = row.store_commit
    if commit is not None:
        if not store.read_back(repo, commit, prefix, manifest):
            return commit, []
        log.info("%s: the store's copy at %s is not the box's outputs now; pushing them anew",
                 row.label, commit[:12])
        reg.update(row.label, store_commit=None)
    commit = store.push(repo, pulled.path, manifest, prefix,
                        f"{row.job} on {row.label}: {len(manifest)} files")
    reg.update(row.label, store_commit=commit)
    log.info("%s: pushed to %s at %s", row.label, repo, commit[:12])
    return commit, store.read_back(repo, commit, prefix, manifest)


STOP_GRACE_S = 10  # TERM to the job's process group, KILL after this


def _ended(cfg: Config, reg: Registry, row: Row, job: str, spec: dict[str, Any],
           state: dict[str, Any], box_now: Any) -> dict[str, Any]:
    """The job ended on the box, its end recorded: a running job only once the box's deadline
    has passed (stopped, TERM then KILL), one that never ran closed so that none of its steps
    starts after the read."""
    phase = state.get("phase")
    if phase == "running" or state.get("gating"):
        until = jobstate.deadline(spec, state)
        doing = "running" if phase == "running" else "in a gate"
        capped = jobstate.past_cap(row, datetime.now(UTC))  # the box cannot move it
        if not capped and (until is None or jobstate.box_time(box_now) < until):
            when = "an unknown time" if until is None else f"{until:%Y-%m-%d %H:%M:%S}Z"
            raise UsageError(f"{row.label}: job {job} is still {doing} (the box's deadline is "
                             f"{when}); tear it down when it has ended")
        # past the cap the box may name no deadline at all
        log.info("%s: job %s is past its deadline (%s); stopping it", row.label, job,
                 "unknown" if until is None else f"{until:%H:%M:%S}Z")
    else:
        log.info("%s: job %s is %s; closing it on the box first", row.label, job,
                 state.get("phase"))
    d = shlex.quote(f"{ROOT}/{JOBS}/{job}")
    res = boxssh.run(cfg, row, f"cd {ROOT} && {VENV_PYTHON} -m agent job stop {d} "
                     f"--grace {STOP_GRACE_S}", timeout=STOP_GRACE_S + 110)
    try:
        after = json.loads(res.stdout) if res.returncode == 0 else None
    except ValueError:
        after = None
    if not isinstance(after, dict) or after.get("phase") not in TERMINAL:
        raise KeptBox(f"{row.label}: job {job} could not be stopped on the box "
                      f"({res.stderr.strip()[-200:] or f'exit {res.returncode}'}); box kept")
    reg.update(row.label, job_state=after["phase"], invocations=after.get("invocations"),
               refusal=_refusal(after))
    return after


def _refusal(state: dict[str, Any]) -> str | None:
    r = state.get("refused")
    return f"{r.get('step')}: {r.get('reason')}" if isinstance(r, dict) else None


def _keep(row: Row, problems: list[str], where: str, lasting: bool = False) -> NoReturn:
    lines = "\n  ".join(problems)
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise KeptBox(f"{row.label}: box kept, its outputs do not match in the {where}:\n  {lines}",
                  problems[0] + more, lasting)


def _outputs(row: Row, job: str) -> str:
    """The outputs folder on the box, from the row (the operator's own record of the job,
    made when it was placed), never from the box's job.json, which the job can rewrite."""
    rel = row.outputs
    parts = PurePosixPath(rel).parts if rel else ()
    if not parts or PurePosixPath(rel or "").is_absolute() or ".." in parts:
        raise KeptBox(f"{row.label}: its row names no outputs folder for job {job} ("
                      f"{rel!r}: a row written before rows recorded it?); nothing read, box "
                      f"kept: deploy the job file again (it records the folder), then "
                      f"`fleet teardown {row.label}`",
                      f"the row names no outputs folder for job {job}", lasting=True)
    return f"{job_workdir(ROOT, job)}/{rel}"


def _destroy(cfg: Config, reg: Registry, providers: Mapping[str, Provider], row: Row,
             out: Outcome) -> None:
    """The box goes through the one destroy path (`fleet.ops.destroy`), on the box the
    teardown read back; a destroy that fails is kept in the row's teardown note."""
    order = destroy.Order(row.label, seen_id=row.provider_id, also={"teardown": None},
                          again=f"fleet teardown {row.label}")
    try:
        destroy.destroy(cfg, reg, providers, order)
    except ProviderError as e:
        reg.update(row.label, teardown=f"destroy failed: {e}"[:300])
        raise
    out.destroyed = True
    log.info("%s: destroyed", row.label)
