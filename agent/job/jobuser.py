"""The job's own user: its code (each gate's command, the run's command) runs as the fixed uid
and gid `agent.contract.JOB_UID`/`JOB_GID`, never as root.

What that gives, whether or not /etc/passwd names the user:
- the agent's records (`<root>/jobs/<name>/`, made 0700 here), the store token and the toolchain
  cache (root-owned, read-only to others) are out of the job's reach, and the job cannot signal
  the agent's steps or its runner (EPERM);
- a uid is a mark no process can shed (an `env -i setsid` daemon keeps it): `sweep` kills every
  process whose real, effective, saved or filesystem uid is the job's, wherever it was
  reparented to, at each step's end, a refusal, a stop and an interrupted run.

`hand_over` gives the job its work directory before any of its code runs (the gate step's
start): the inputs and the outputs folder are the job user's; the directory itself stays root's
(group the job's, sticky, so the job may add files but never remove or rename root's), and so do
the folders that lead to the toolchain's link: the scan and the fetch vouched for those bytes.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.contract import JOB_AREA_BASE, JOB_GID, JOB_UID, JOB_USER
from agent.job import domain
from agent.job.inputs import outputs_place
from agent.job.model import Job, Refused

GPU_NODES = ("/dev/nvidia*", "/dev/dri/*")
WORK_MODE = 0o1775  # root:<job group>, sticky: the job adds files, never removes root's
REAP_S = 5.0
POLL_S = 0.01


def popen_kwargs(job: Job, env: Mapping[str, str],
                 first: Callable[[], None] | None = None) -> dict[str, Any]:
    """subprocess.Popen's keyword arguments that start the job's code as its own user: no
    supplementary group of root's, only those owning GPU device nodes it could not open
    otherwise. `first` runs in the child while it is still root (joining the step's cgroup,
    which only root may move it into); then the child drops to the job's user, and a child
    that cannot never execs (its Popen fails)."""
    groups = gpu_groups()

    def become_job_user() -> None:
        if first is not None:
            first()
        os.setgroups(groups)
        os.setregid(JOB_GID, JOB_GID)
        os.setreuid(JOB_UID, JOB_UID)

    return {"preexec_fn": become_job_user, "umask": 0o022,
            "env": {**env, "HOME": str(job.work), "USER": JOB_USER, "LOGNAME": JOB_USER}}


def gpu_groups() -> list[int]:
    """The groups owning a GPU device node that is not world read-write (never root's group:
    that would open far more than the GPU)."""
    found: set[int] = set()
    for pattern in GPU_NODES:
        folder, glob = pattern.rsplit("/", 1)
        for node in Path(folder).glob(glob):
            try:
                st = node.stat()
            except OSError:
                continue
            if st.st_mode & 0o006 != 0o006 and st.st_gid != 0:
                found.add(st.st_gid)
    return sorted(found)


def hand_over(job: Job) -> None:
    """The job's work directory made ready for its user (Refused when it cannot be)."""
    keep = _toolchain_path(job)
    taken = outputs_place(job.work, job.outputs)  # else the mkdir below would hide why
    if taken is not None:
        raise Refused(taken)
    try:
        _root_dir(Path(JOB_AREA_BASE), 0o755)
        _root_dir(job.work.parent, 0o755)
        job.work.mkdir(exist_ok=True)
        os.chmod(job.dir, 0o700)  # the agent's records: root's alone
        job.outputs_dir.mkdir(parents=True, exist_ok=True)
        for folder, dirs, files in os.walk(job.work):
            here = Path(folder)
            for name in (*dirs, *files):
                path = here / name
                if path not in keep:
                    os.lchown(path, JOB_UID, JOB_GID)
        for path in (job.work, *keep):
            os.lchown(path, 0, JOB_GID if path.is_dir() and not path.is_symlink() else 0)
            if not path.is_symlink():
                os.chmod(path, WORK_MODE)
    except OSError as e:
        raise Refused(f"cannot hand the work directory {job.work} to the job's user "
                      f"(uid {JOB_UID}): {e.strerror or e}") from None


def _toolchain_path(job: Job) -> set[Path]:
    """The toolchain's link and the folders leading to it under the work directory."""
    if job.toolchain is None:
        return set()
    link = job.work / job.toolchain.path
    return {link, *(p for p in link.parents if p != job.work and job.work in p.parents)}


def _root_dir(path: Path, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a directory")
    if st.st_uid != 0 or st.st_gid != 0:
        os.chown(path, 0, 0)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)


def holders() -> list[int]:
    """Every live process (not a zombie) whose real, effective, saved or fs uid is the job's."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _of_job(int(entry)):
            found.append(int(entry))
    return found


def _of_job(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    if fields.get("State", "").split()[:1] == ["Z"]:
        return False  # dead already; its parent reaps it
    return str(JOB_UID) in fields.get("Uid", "").split()


def refuse_if_taken() -> None:
    """At admission: the job's uid must be free, or its sweeps would kill what is not the job's
    and what the uid started before could touch the job."""
    taken = holders()
    if taken:
        raise Refused(f"the job's uid {JOB_UID} is in use by {len(taken)} process(es) not of "
                      f"this job (pid {', '.join(map(str, taken[:5]))}); nothing of it ran")


def sweep() -> int:
    """SIGKILL every process of the job's uid and wait for each to die (reaped by whoever is
    its parent: this process for its own children); how many were killed."""
    return domain.kill_until_gone(holders, _reap)


def _reap(pids: list[int]) -> None:
    """Until each is dead (our own children reaped here; another's is a zombie its parent
    reaps, which holders() skips), within REAP_S."""
    until = time.monotonic() + REAP_S
    while True:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not any(_of_job(pid) for pid in pids) or time.monotonic() >= until:
            return
        time.sleep(POLL_S)
