"""A one-shot job on its box: staged, then taken through the agent's steps one by one.

The agent enforces the order on the box (admit, fetch, scan, gate, run) and refuses every step
after a refusal; these operations only decide, from one `JobState` read per run, which steps
are already done, so that a second run of the deploy changes nothing.
"""

from __future__ import annotations

import hashlib
from io import BytesIO, StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import FileUploadCommand, OperationError, StringCommand, operation
from pyinfra.api.command import QuoteString

from agent.contract import (
    ADMITTED,
    AFTER,
    ENDED,
    FINISHED,
    JOB_FILE,
    JOB_INPUTS_DIGEST,
    JOBS,
    NEW,
    PROGRESS,
    ROOT,
    STEPS,
    TOKEN,
    TOKEN_UPLOAD,
    VENV_PYTHON,
    job_workdir,
)
from facts.job import JobState

# the phase each step leaves behind (a run: once it has finished); a step is done once the job
# reached it or a later one
_REACHED = {**AFTER, "run": FINISHED}
_ORDER = (*PROGRESS, FINISHED)


def read(job_name: str, root: str = ROOT) -> dict[str, Any]:
    """The job's `JobState` on the current host, as a deploy reads it once, before its first
    operation, to pass to each of these (``job_state=``): every one then decides from the box
    as it was before the run, as `BoxState` readers do (`operations.util.box_state`), and a
    no-change re-run costs one read."""
    return host.get_fact(JobState, root=root, job=job_name)


def _known(job_name: str, root: str, given: dict[str, Any] | None) -> dict[str, Any]:
    return given if given is not None else read(job_name, root)


def step_done(step: str, state: dict[str, Any] | None) -> bool:
    phase = (state or {}).get("phase")
    if phase in ENDED:
        return True
    if phase not in _ORDER:
        return False  # new, unknown or unreadable: ask the agent, which knows
    return _ORDER.index(phase) >= _ORDER.index(_REACHED[step])


def jobdir(root: str, name: str) -> str:
    return f"{root}/{JOBS}/{name}"


@operation()
def staged(job_name: str, spec: str, inputs: bytes | None = None, root: str = ROOT,
           job_state: dict[str, Any] | None = None):
    """
    Place a job on the box: ``job.json`` and its inputs in the work directory. A job that
    already took a step is never changed: a different spec under the same name is refused.

    + job_name: the job's name (its folder under ``<root>/jobs``)
    + spec: the full ``job.json`` text (``fleet.core.job.Job.box_spec``)
    + inputs: a tarball of the job's input folder, unpacked into the job's work directory
      (``agent.contract.job_workdir``: outside the root, where the job's user reaches it)
    + root: the fleet's directory on the box
    + job_state: the job's ``JobState`` as the deploy read it before this run (read here if not)

    **Example:**

    .. code:: python

        job.staged(name="Stage", job_name="matmul-bench", spec=text, inputs=tar_bytes)
    """
    info = _known(job_name, root, job_state)
    want = hashlib.sha256(spec.encode()).hexdigest()
    want_inputs = hashlib.sha256(inputs).hexdigest() if inputs is not None else "none"
    current = info.get("spec_sha256") == want and info.get("inputs_sha256") == want_inputs
    if current:
        host.noop(f"job {job_name} is staged")
        return
    if info.get("state") is not None:
        raise OperationError(f"job {job_name} already started on this box with another job file "
                             "or inputs; give the new job another name")
    d, work = jobdir(root, job_name), job_workdir(root, job_name)
    yield StringCommand("mkdir -p", QuoteString(d), QuoteString(work))
    if inputs is not None:
        tarball = f"{d}/inputs.tar"
        yield FileUploadCommand(BytesIO(inputs), tarball)
        yield StringCommand("tar -xf", QuoteString(tarball), "-C",
                            QuoteString(work), "&& rm -f", QuoteString(tarball))
    yield FileUploadCommand(StringIO(spec), f"{d}/{JOB_FILE}")
    yield StringCommand("echo", QuoteString(want_inputs), ">",
                        QuoteString(f"{d}/{JOB_INPUTS_DIGEST}"))


def token_wanted(info: dict[str, Any], value: str) -> bool | None:
    """True: write the token; False: remove it; None: nothing to do. The token is on the box
    only until the job's fetch (which consumes it): never once the fetch is done, the job was
    refused or stopped, or its state is unreadable, so that none of the job's code can read it."""
    state = info.get("state") or {}
    needed = state.get("phase", NEW) in (NEW, ADMITTED)  # unreadable: not needed
    present = info.get("token_sha256")
    if not needed:
        return False if present else None
    return None if present == hashlib.sha256(value.encode()).hexdigest() else True


@operation()
def token(job_name: str, value: str, root: str = ROOT, job_state: dict[str, Any] | None = None):
    """
    Write the store token the box reads toolchains with to ``<root>/hf_token`` (mode 0600),
    for the job's fetch, which removes it (the job never runs while it is there); once the
    fetch is done, never again (and a token still there is removed). Only its digest is ever
    compared; the token is never printed.

    + job_name: the job it is written for (whose state tells what the box holds)
    + value: the token
    + root: the fleet's directory on the box
    + job_state: the job's ``JobState`` as the deploy read it before this run (read here if not)

    **Example:**

    .. code:: python

        job.token(name="Store token", job_name="matmul-bench", value=secret)
    """
    info = _known(job_name, root, job_state)
    wanted = token_wanted(info, value)
    if wanted is None:
        host.noop("store token: nothing to do (current, or consumed by the fetch)")
        return
    if not wanted:
        yield StringCommand("rm -f", QuoteString(f"{root}/{TOKEN}"),
                            QuoteString(f"{root}/{TOKEN_UPLOAD}"))
        return
    tmp = f"{root}/{TOKEN_UPLOAD}"
    yield StringCommand("mkdir -p", QuoteString(root), "&& umask 077 && : >", QuoteString(tmp))
    yield FileUploadCommand(StringIO(value), tmp)
    yield StringCommand("chmod 600", QuoteString(tmp), "&& mv -f", QuoteString(tmp),
                        QuoteString(f"{root}/{TOKEN}"))


@operation()
def stepped(job_name: str, step: str, root: str = ROOT,
            job_state: dict[str, Any] | None = None):
    """
    Take the job through one of the agent's steps (``python -m agent job STEP``) unless it is
    done. A refused job fails here with the refusal, and nothing after it runs.

    + job_name: the job's name
    + step: admit, fetch, scan, gate or run (run waits until the job has ended)
    + root: the fleet's directory on the box
    + job_state: the job's ``JobState`` as the deploy read it before this run (read here if not)

    **Example:**

    .. code:: python

        job.stepped(name="Admission", job_name="matmul-bench", step="admit")
    """
    if step not in STEPS:
        raise OperationError(f"unknown job step {step!r} ({', '.join(STEPS)})")
    state = _known(job_name, root, job_state).get("state")
    refused = (state or {}).get("refused")
    if refused:
        raise OperationError(f"job {job_name} was refused at {refused.get('step')}: "
                             f"{refused.get('reason')}")
    if step_done(step, state):
        host.noop(f"job {job_name}: {step} done ({(state or {}).get('phase')})")
        return
    wait = ("--wait",) if step == "run" else ()
    yield StringCommand("cd", QuoteString(root), f"&& {VENV_PYTHON} -m agent job", step, *wait,
                        QuoteString(jobdir(root, job_name)))
