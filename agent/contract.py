"""What the operator's side may know of the box: paths, program names, job phases, exit codes.

The one agent module that fleet/, facts/ and operations/ import. It imports nothing of the
agent (the standard library only), so that reading it never pulls in the agent's runtime.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# ---------------------------------------------------------------------------- paths

ROOT = "/root/fleet"  # the fleet's directory on the box, unless agent.toml names another
CONFIG = "agent.toml"
BOOT_SCRIPT = "boot.sh"
# the box's SSH host keys, kept where a restart keeps them (on RunPod the volume), and put
# back into SSH_DIR by the start command before sshd starts
HOST_KEYS = "ssh-host-keys"
SSH_DIR = "/etc/ssh"
PEERS = "peers.txt"
AGENT_CODE = "agent"  # the agent's code; its BUNDLE file holds the bundle's digest
BUNDLE_STAMP = "BUNDLE"
VENV = "venv"  # the agent's Python environment
VENV_PYTHON = f"{VENV}/bin/python"
INBOX = "in"
OUT = "out"
RUN = "run"
LOGS = "log"
RELEASES = "releases"
JOBS = "jobs"
STANDING_LOG = f"{OUT}/standing.log"
POINTER = "standing.node"
POINTER_DIGEST = "standing.node.sha256"
POINTER_PREVIOUS = "standing.node.previous"  # what `agent switch` moved away from (kept)
RELEASES_STAGED = "releases.staged"  # <sha16>: staged by a publish at the file's mtime (kept)
STATUS = f"{RUN}/status.json"
AGENT_PID = f"{RUN}/agent.pid"
BOOT_LOG = f"{LOGS}/boot.log"
TOKEN = "hf_token"  # the store token, for a job's fetch alone
TOKEN_UPLOAD = "hf_token.fleet-new"  # a deploy's upload of it, renamed into place

# in a job's directory, <root>/jobs/<name>/
JOB_FILE = "job.json"
JOB_STATE = "state.json"
JOB_OUTCOME = "outcome.json"  # how the job ended, written by the agent (never in the outputs)
JOB_INPUTS_DIGEST = "inputs.sha256"

# the job's own code runs as this user and group (whether or not /etc/passwd names them): it can
# neither reach the agent's records nor signal the agent's steps, and a uid is a mark no process
# can shed, so every process of it is found and killed at each step's end
JOB_UID = 64000
JOB_GID = 64000
JOB_USER = "fleet-job"
# root-owned 0755, outside the fleet's root (which sits in root's 0700 home): the job's work
# directories and the toolchain cache, one area per fleet root so that two roots never share one
JOB_AREA_BASE = "/srv/fleet-jobs"

SWITCH_LOCK = "switch.lock"  # under RUN: held by `agent switch` and the deploy's pointer write



def job_area(root: str) -> str:
    """What the job's user may reach for the fleet at `root`: `<base>/<sha256(root)[:16]>`."""
    return f"{JOB_AREA_BASE}/{hashlib.sha256(root.encode()).hexdigest()[:16]}"


def job_workdir(root: str, name: str) -> str:
    """The job's work directory (its inputs, its outputs, the toolchain's link)."""
    return f"{job_area(root)}/{name}"


def job_cache(root: str) -> str:
    """The toolchain cache: root-owned, read-only to the job (`.` keeps it off job names)."""
    return f"{job_area(root)}/.cache"


DEFAULT_ROOT = Path(ROOT)
DEFAULT_CONFIG = DEFAULT_ROOT / CONFIG


class Layout:
    """Every path under the root, computed once (the loop asks for some of them each tick)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / CONFIG
        self.inbox = root / INBOX
        self.out = root / OUT
        self.run = root / RUN
        self.logs = root / LOGS
        self.releases = root / RELEASES
        self.standing_log = root / STANDING_LOG
        self.pointer = root / POINTER
        self.pointer_digest = root / POINTER_DIGEST
        self.status = root / STATUS
        self.heartbeat = self.run / "heartbeat"  # its mtime is the heartbeat
        self.lock = self.run / "agent.lock"
        self.switch_lock = self.run / SWITCH_LOCK  # held by `agent switch` while it runs
        self.agent_pid = root / AGENT_PID
        self.state = self.run / "state.json"
        self.agent_log = self.logs / "agent.log"
        self.recovery_log = self.logs / "recovery.log"
        self.pack_log = self.logs / "pack.log"
        self._pidfiles: dict[str, Path] = {}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    def pidfile(self, program: str) -> Path:
        path = self._pidfiles.get(program)
        if path is None:
            path = self._pidfiles[program] = self.run / f"{program}.pid"
        return path

    def ensure(self) -> None:
        for d in (self.root, self.inbox, self.out, self.run, self.logs, self.releases):
            d.mkdir(parents=True, exist_ok=True)


# ---------------------------------------------------------------------------- programs

NODE = "node"
MINER = "miner"
PROVER = "prover"
PROGRAMS = (NODE, MINER, PROVER)

# ---------------------------------------------------------------------------- job phases

NEW = "new"
ADMITTED = "admitted"
FETCHED = "fetched"
SCANNED = "scanned"
GATED = "gated"
RUNNING = "running"
FINISHED = "finished"
FAILED = "failed"
INTERRUPTED = "interrupted"
REFUSED = "refused"

STEPS = ("admit", "fetch", "scan", "gate", "run")
# the phase each step starts from, and the one it leaves behind when it succeeds
BEFORE = {"admit": NEW, "fetch": ADMITTED, "scan": FETCHED, "gate": SCANNED, "run": GATED}
AFTER = {"admit": ADMITTED, "fetch": FETCHED, "scan": SCANNED, "gate": GATED, "run": RUNNING}
PROGRESS = (NEW, ADMITTED, FETCHED, SCANNED, GATED, RUNNING)  # in order, before the end
ENDED = (FINISHED, FAILED, INTERRUPTED)  # ran (or was stopped before it ran), and is over
# nothing more happens on the box: ended, or refused (a refused job never runs)
TERMINAL = (*ENDED, REFUSED)

# ---------------------------------------------------------------------------- exit codes

EXIT_OK = 0
EXIT_REFUSED = 1  # the agent refused on purpose (a second agent, a stop that did not finish)
EXIT_USAGE = 2  # a user's mistake: bad config, bad argument
EXIT_JOB_REFUSED = 3  # `job STEP`: the job is refused (now or before)
# `switch`, by outcome
SWITCH_EXIT = {"switched": EXIT_OK, "unchanged": EXIT_OK, "refused": EXIT_REFUSED,
               "reverted": 3, "failed": 4, "superseded": 5}
