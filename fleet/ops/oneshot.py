"""`fleet run ROLE JOB.toml`: one measurement on one one-shot box, from rent to teardown.

Rent (the budget counts the box for the job's TTL), wait for SSH, run deploys/oneshot.py on it
(agent, job, admission, toolchain, scan, gates, run), record what the box says in the registry,
then tear it down through the read-back (fleet.ops.teardown) unless told to keep it. A refused job
records zero invocations and goes straight to teardown: a fault of the box, never a result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agent.contract import TERMINAL
from fleet.boxes import jobstate, lifecycle
from fleet.boxes.pyinfra_run import run_pyinfra
from fleet.core.boxes import Row, unread
from fleet.core.errors import FleetError, UsageError
from fleet.core.states import BoxKind
from fleet.core.times import in_hours, parse_iso
from fleet.ops import offers, teardown
from fleet.ops import rent as rent_mod
from fleet.state.registry import Registry

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fleet.core.config import Config
    from fleet.core.job import Job
    from fleet.providers.base import Provider

DEPLOY = "deploys/oneshot.py"


@dataclass
class Summary:
    label: str
    provider: str
    card: str
    usd_per_hour: float
    job: str
    phase: str | None = None
    admission: str | None = None
    refusal: str | None = None
    invocations: int | None = None
    exit_code: int | None = None
    toolchain: dict[str, Any] | None = None
    gates: list[dict[str, Any]] = field(default_factory=list)
    outputs_files: int = 0
    outputs_bytes: int = 0
    store_commit: str | None = None
    destroyed: bool = False
    kept: str | None = None
    problem: str | None = None  # why the job never ran to its end (the box not ready, ...)
    cost_usd: float = 0.0

    @property
    def verdict(self) -> str:
        if self.refusal:
            return "refused (a fault of the box, not a result)"
        if self.phase == "finished":
            return "ran"
        return self.phase or "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "verdict": self.verdict}


def deadline_minutes(ttl_minutes: int, gates: int) -> int:
    """How long a job may keep its box: each gate may take a full TTL, then the run one."""
    return ttl_minutes * (gates + 1)


def mark_job(label: str, job: str, ttl_minutes: int, gates: int = 0,
             outputs: str | None = None) -> None:
    """The deploy's registry step: the row names its job, its outputs folder and its deadline
    (a box rented by `fleet rent` and given a job by hand gets its deadline from now). A new
    job on a box whose last job was not read back is refused: its outputs would never be
    pulled."""
    from fleet.boxes.deploy_support import config

    reg = Registry(config().registry)
    with teardown.one_at_a_time(reg, label):  # never while a teardown reads the last job
        row = reg.get(label)
        if row is None:
            return
        if row.job == job and row.expires_at:
            if outputs and not row.outputs:  # a row written before rows named the folder
                reg.update(label, outputs=outputs, kept_lasting=None)
            return
        if row.job != job and unread(row):
            raise UsageError(f"{label} still holds job {row.job}, not read back: run `fleet "
                             f"teardown {label} --keep-box` before giving it job {job}")
        reg.update(label, job=job, outputs=outputs, read_back=None, store_commit=None,
                   job_state=None, invocations=None, refusal=None, teardown=None,
                   kept_lasting=None,
                   expires_at=in_hours(deadline_minutes(ttl_minutes, gates) / 60),
                   cap_at=in_hours(jobstate.cap_minutes(ttl_minutes, gates) / 60))


def cost(row: Row) -> float:
    start = parse_iso(row.created_at)
    end = (parse_iso(row.destroyed_at)
           if row.destroyed_at else datetime.now(UTC))
    return row.usd_per_hour * max(0.0, (end - start).total_seconds()) / 3600


def run(cfg: Config, reg: Registry, providers: dict[str, Provider], role_name: str, job: Job,
        keep: bool = False) -> Summary:
    role = cfg.role(role_name)
    if role.kind != BoxKind.ONESHOT:
        raise UsageError(f"role {role_name} is {role.kind}: `fleet run` takes a one-shot role")
    from fleet.boxes.deploy_support import store_endpoint

    # a job the box would refuse rents nothing: the very job.json the deploy uploads, checked
    # by the agent's own parser
    job.box_spec(role, store_endpoint(cfg))
    if job.toolchain is not None:
        from fleet.providers import store

        if not store.token():
            raise UsageError("the job fetches a toolchain but no store token is set (HF_TOKEN "
                             "or `hf auth login`); nothing was rented")
    chosen = {job.provider: lifecycle.provider_for(providers, job.provider, "cannot rent")} \
        if job.provider else providers
    found, failures = offers.search(role, chosen.values(), card=job.card, gpus=job.gpus)
    for f in failures:
        log.info("warning: %s", f)
    minutes = deadline_minutes(job.ttl_minutes, len(job.gates))
    res = rent_mod.rent(cfg, reg, role, found, providers, job=(job.name, minutes))
    # the teardown reads this folder only; past the cap the box's deadlines no longer count
    row = reg.update(res.row.label, outputs=job.outputs, cap_at=in_hours(
        jobstate.cap_minutes(job.ttl_minutes, len(job.gates)) / 60))
    log.info("rented %s: %s x%s on %s at $%.3f/h, TTL %s min (the box's deadline %s min, "
             "gates included)", row.label, row.card, row.gpu_count, row.provider,
             row.usd_per_hour, job.ttl_minutes, minutes)
    summary = Summary(row.label, row.provider, row.card, row.usd_per_hour, job.name)
    try:
        row = rent_mod.wait_ready(cfg, reg, providers, [row.label])[row.label]
    except FleetError as e:
        # nothing reached the box: the teardown destroys it without a read
        log.info("%s: %s; destroying it (nothing ran on it)", row.label, e)
        summary.problem = str(e)
    else:
        log.info("%s: SSH ready", row.label)
        try:
            state = _deploy(cfg, row, job)
        except FleetError as e:
            log.info("%s: %s", row.label, e)
            summary.problem = str(e)
            state = {}
        row = jobstate.record(reg, row.label, state)
        _fill(summary, state)
    log.info("%s: %s%s", row.label, summary.verdict,
             f": {summary.refusal}" if summary.refusal else
             f", exit {summary.exit_code}" if summary.exit_code is not None else "")
    if keep and not summary.refusal and not summary.problem:  # torn down regardless
        log.info("%s: kept (--keep); `fleet teardown %s` reads it back and destroys it",
                 row.label, row.label)
    else:
        try:
            out = teardown.teardown(cfg, reg, providers, row.label)
        except (FleetError, OSError) as e:  # the operator's disk too: one line, box kept
            summary.kept = str(e)
        else:
            summary.outputs_files, summary.outputs_bytes = out.files, out.bytes
            summary.store_commit, summary.destroyed = out.commit, out.destroyed
    final = reg.get(row.label)
    if final is not None:
        summary.cost_usd = round(cost(final), 4)
    return summary


def _deploy(cfg: Config, row: Row, job: Job) -> dict[str, Any]:
    """deploys/oneshot.py on the box until the job has ended or was refused (a second try
    after a failure that left it neither: each step is done once, so a retry resumes). Each
    run is bounded by the job's cap (`jobstate.cap_minutes`): a run past it is killed, and
    not tried again."""
    state: dict[str, Any] = {}
    timeout_s = jobstate.cap_minutes(job.ttl_minutes, len(job.gates)) * 60
    for attempt in (1, 2):
        result = run_pyinfra(cfg, [row.label], {"job": str(job.path)},
                             deploy=DEPLOY, timeout_s=timeout_s)
        state = jobstate.job_state(cfg, row, job.name)
        if state.get("phase") in TERMINAL:
            return state
        if result.timed_out:
            log.info("%s: the deploy %s with the job %s", row.label, result.timed_out,
                     state.get("phase") or "not started")
            return state
        if attempt == 1:
            log.info("%s: the deploy stopped (exit %s) with the job %s; once more",
                     row.label, result.rc, state.get("phase") or "not started")
    return state


def _fill(summary: Summary, state: dict[str, Any]) -> None:
    summary.phase = state.get("phase")
    refused = state.get("refused")
    if isinstance(refused, dict):
        summary.refusal = f"{refused.get('step')}: {refused.get('reason')}"
    adm = state.get("admission") or {}
    summary.admission = adm.get("reason")
    summary.invocations = state.get("invocations")
    summary.exit_code = state.get("exit_code")
    summary.toolchain = state.get("toolchain")
    summary.gates = state.get("gates") or []
