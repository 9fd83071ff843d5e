"""What the operator's side may know of the box: paths, program names, program states, job
phases, exit codes, and the shape of every JSON document the agent's CLI prints.

The one agent module that fleet/, facts/ and operations/ import. It imports nothing of the
agent (the standard library only), so that reading it never pulls in the agent's runtime.

The states and phases are StrEnums: each member equals its string, so the JSON on the wire
is the same text whichever side wrote it. The documents are TypedDicts: the agent builds
them typed, and the facts and fleet's readers take them, so that mypy sees the line between
the two sides. A key the writer leaves out in some cases is `NotRequired`; a value that can
be unknown is `... | None`.
"""

# no `from __future__ import annotations`: a TypedDict knows its NotRequired keys at run time
# (`__optional_keys__`) only from annotations that are evaluated
import hashlib
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, NotRequired, Required, TypedDict

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
# a stop asked for (`job stop`, or a teardown closing a job that has not reached the box): the
# agent refuses every step of a job that has one (`stop_document` is its shape)
JOB_STOP = "stop.json"
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

NODE: Final = "node"
MINER: Final = "miner"
PROVER: Final = "prover"
PROGRAMS = (NODE, MINER, PROVER)


class ProgramState(StrEnum):
    """A supervised program's state (`agent.daemon.program.Program.state`, and `state` of
    each of the status's `programs`)."""

    RUNNING = "running"
    BACKOFF = "backoff"  # crashed after a short run, waiting to start again
    STOPPING = "stopping"  # TERM sent to its process group, KILL at the deadline
    BLOCKED = "blocked"  # a guard forbids it: admission, no node binary
    STOPPED = "stopped"  # not running and not held back


class AgentRunState(StrEnum):
    """The agent's own state (`agent.state` of the status)."""

    RUNNING = "running"
    STOPPING = "stopping"  # asked to stop (`agent stop`): its programs are being stopped
    STOPPED = "stopped"  # its last status after a stop: the programs stopped with it
    EXITED = "exited"  # its last status after any other end: the programs run on


# a process of the program is there (running, or asked to stop and not yet gone)
PROCESS_STATES = (ProgramState.RUNNING, ProgramState.STOPPING)
# no process, and none waited for: the supervisor may start one now
IDLE_STATES = (ProgramState.BLOCKED, ProgramState.STOPPED)

# ---------------------------------------------------------------------------- job phases


class JobPhase(StrEnum):
    """A one-shot job's phase (`phase` of its state.json)."""

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


NEW = JobPhase.NEW
ADMITTED = JobPhase.ADMITTED
FETCHED = JobPhase.FETCHED
SCANNED = JobPhase.SCANNED
GATED = JobPhase.GATED
RUNNING = JobPhase.RUNNING
FINISHED = JobPhase.FINISHED
FAILED = JobPhase.FAILED
INTERRUPTED = JobPhase.INTERRUPTED
REFUSED = JobPhase.REFUSED

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


class SwitchOutcome(StrEnum):
    """How `agent switch` ended (`outcome` of what it prints)."""

    SWITCHED = "switched"
    UNCHANGED = "unchanged"  # it ran the release already, synced
    REFUSED = "refused"  # nothing changed: the file is not the release, or a switch is on
    REVERTED = "reverted"  # not healthy by the deadline: back on the earlier release
    FAILED = "failed"
    SUPERSEDED = "superseded"  # someone else wrote the pointer meanwhile: not reverted


# `switch`, by outcome
SWITCH_EXIT = {SwitchOutcome.SWITCHED: EXIT_OK, SwitchOutcome.UNCHANGED: EXIT_OK,
               SwitchOutcome.REFUSED: EXIT_REFUSED, SwitchOutcome.REVERTED: 3,
               SwitchOutcome.FAILED: 4, SwitchOutcome.SUPERSEDED: 5}
# how long a `switch` waits for another switch to end before it is refused; with its own
# deadline and a revert's, what one switch may legitimately take (a publish's wave waits it)
SWITCH_LOCK_WAIT_S = 900.0

# ---------------------------------------------------------------------------- documents
#
# What the agent's CLI prints, as written (agent/daemon/status.py, agent/commands/,
# agent/job/state.py, agent/base/manifest.py, agent/space.py). The parts no reader on the
# operator's side looks into stay `dict[str, Any]`; docs/agent.md describes them.


class AgentDoc(TypedDict):
    """`agent` of the status: the agent process that wrote it."""

    pid: int
    version: str
    state: AgentRunState
    started_at: str
    uptime_s: float
    ticks: int
    tick_s: float
    root: str
    config: str


class ObserverDoc(TypedDict):
    """`observer`: the thread that reads the programs' own status, off the loop."""

    alive: bool
    restarts: int
    last_error: str | None
    round_at: str | None
    hung: list[str]


class DigestsDoc(TypedDict):
    """`digests`: the hasher that checks what each program runs."""

    hashing: str | None
    for_s: float | None
    restarts: int
    last_error: str | None


class WritesDoc(TypedDict):
    """`storage` of the status: whether the agent can write its files under run/."""

    ok: bool
    error: str | None
    since: str | None
    failing: list[str]


class AdmissionDoc(TypedDict):
    """`admission`: whether GPU work may run here, and why (not)."""

    admitted: bool
    reason: str
    vendor: str
    driver: str | None
    wanted_driver: str | None
    uuids: list[str]
    qualified_gpus: list[str]
    checked_at: str | None
    rocm: NotRequired[str | None]  # AMD boxes only
    wanted_rocm: NotRequired[str | None]


class P2PDoc(TypedDict):
    """`p2p`: the port mapping the provider gave the node's p2p port."""

    mapped: bool
    internal_port: int
    provider: str | None
    public_ip: str | None
    public_port: int | None
    reason: str | None


class PeerDoc(TypedDict):
    """One entry of the node's `peer_list`."""

    dir: str  # in or out
    remote: str  # HOST:PORT
    public: bool


class RpcDoc(TypedDict):
    """`node.rpc`: the node's own status RPC, each figure None unless it is what it should be."""

    version: str | None
    blocks: int | None
    daa_score: int | None
    peers: int | None
    peers_in: int | None
    peers_out: int | None
    synced: bool | None
    exec_tip: int | None
    seed: str | None
    peer_list: list[PeerDoc] | None


class SwitchRecord(TypedDict):
    """The last switch of the node's binary, as the status and the read-back show it: the
    sha16s it moved between, and when (UTC ISO) each part of it happened."""

    from_sha16: str | None
    to_sha16: str
    applied_at: str | None
    old_exit_at: str | None  # the old node's exit
    new_started_at: str | None  # the new node's start
    synced_at: str | None  # the agent's first synced reading of the new node
    downtime_s: float | None  # from the old node's exit to synced


class NodeDoc(TypedDict):
    """`node`: the binary the agent runs as the node, and its last reading."""

    binary: str | None
    sha256: str | None
    sha16: str | None
    source: str | None
    pointer: dict[str, Any]
    rpc: RpcDoc | None
    rpc_error: str | None
    rpc_at: str | None
    switch: SwitchRecord | None


class MinerDoc(TypedDict):
    hashrate: float | None
    seed: str | None
    status_error: str | None
    pack: dict[str, Any]


class ProverDoc(TypedDict):
    state: str | None  # the prover's own word, e.g. proving
    status_error: str | None


class ProgramDoc(TypedDict):
    """One of the status's `programs`: its state, its process and its crash-loop counts."""

    state: ProgramState
    pid: int | None
    pgid: int | None
    adopted: bool | None
    argv: list[str] | None
    binary: str | None
    sha16: str | None
    started_at: str | None
    uptime_s: float | None
    starts: int
    failures: int
    degraded: bool
    next_start_in_s: float | None
    reason: str | None
    last_exit: dict[str, Any] | None
    needs_gpu: bool
    healthy: bool | None
    health_error: str | None
    reading_at: str | None


class StandingDoc(TypedDict):
    last_result_at: str | None
    every_s: float


class StatusFile(TypedDict):
    """`run/status.json`, written by the agent every tick."""

    schema: int
    ts: str
    agent: AgentDoc
    observer: ObserverDoc
    digests: DigestsDoc
    storage: WritesDoc
    admission: AdmissionDoc
    p2p: P2PDoc
    node: NodeDoc
    miner: MinerDoc
    prover: ProverDoc
    recovery: dict[str, Any]
    programs: dict[str, ProgramDoc]
    standing: StandingDoc


class DiskDoc(TypedDict):
    """`disk` of `agent status`: free and total bytes under run/ and out/."""

    free_bytes: dict[str, int | None]
    total_bytes: dict[str, int | None]
    full: bool


class StatusDoc(TypedDict, total=False):
    """`python -m agent status`: the last status.json (every key of StatusFile, or `error`
    before the agent wrote one), and whether the agent that wrote it is alive."""

    schema: int
    ts: str
    agent: AgentDoc
    observer: ObserverDoc
    digests: DigestsDoc
    storage: WritesDoc
    admission: AdmissionDoc
    p2p: P2PDoc
    node: NodeDoc
    miner: MinerDoc
    prover: ProverDoc
    recovery: dict[str, Any]
    programs: dict[str, ProgramDoc]
    standing: StandingDoc
    error: str  # no status.json yet
    alive: Required[bool]
    agent_pid: Required[int | None]
    heartbeat_age_s: Required[float | None]
    status_age_s: Required[float | None]
    disk: Required[DiskDoc]


class StopDoc(TypedDict):
    """`JOBDIR/stop.json`: who asked, when (epoch seconds; None where unreadable), the grace."""

    by: str
    at: float | None
    grace_s: float | None


def stop_document(at: float, grace_s: float) -> StopDoc:
    """The stop an operator asks for, at `at` (epoch seconds), with `grace_s` to end."""
    return {"by": "operator", "at": at, "grace_s": grace_s}


class RefusalDoc(TypedDict):
    step: str
    reason: str


class JobStateFile(TypedDict):
    """`JOBDIR/state.json`: a one-shot job's state, changed by each step under the job's lock.
    The records a step keeps of its own (`admission`, `scan`, `gates`, the processes it ran)
    are the agent's; the operator reads them only to print them."""

    name: str
    phase: JobPhase
    refused: RefusalDoc | None
    admission: dict[str, Any] | None
    toolchain: dict[str, Any] | None
    scan: dict[str, Any] | None
    gates: list[dict[str, Any]] | None
    invocations: int
    exit_code: int | None
    started_at: float | None  # Unix seconds, by the box's clock
    finished_at: float | None
    timed_out: bool
    interrupted: dict[str, Any] | None
    runner: dict[str, Any] | None
    process: dict[str, Any] | None
    gating: dict[str, Any] | None
    stopped: dict[str, Any] | None
    steps: dict[str, dict[str, Any]]
    step: dict[str, Any] | None
    killed: int | None  # processes its run left, killed at its end
    strays: int
    cgroups: list[str]
    mark: str
    domain_problem: NotRequired[str]  # what a kill of the job's strays could not end


class JobStateDoc(JobStateFile):
    """`python -m agent job STEP|state`: the state, with when what the job does now must end
    (UTC ISO, by the box's clock; None when nothing of it runs against a deadline)."""

    deadline_at: str | None


class ReadbackProcess(TypedDict):
    """One program of a read-back: the process, and the digest of what it runs."""

    pid: int
    exe_kind: str
    path: str | None
    sha256: str | None
    started_at: str
    instances: int
    # the node's alone: what its status RPC says now
    version: NotRequired[Any]
    synced: NotRequired[Any]
    rpc_error: NotRequired[str | None]


class ReadbackPointer(TypedDict):
    target: str | None
    sha256: str | None
    target_sha256: str | None
    written_at: str | None


class ReadbackDoc(TypedDict, total=False):
    """`python -m agent readback`: what runs now, read from /proc. A program the agent's
    configuration does not name is absent; one it names that does not run is None."""

    node: ReadbackProcess | None
    miner: ReadbackProcess | None
    prover: ReadbackProcess | None
    pointer: Required[ReadbackPointer | None]
    started_after_pointer: Required[bool | None]
    switch: Required[SwitchRecord | None]


class ManifestEntry(TypedDict, total=False):
    """One entry of `python -m agent manifest DIR`: a regular file (size, sha256; with
    `--tar`, its mtime_ns and `changed` when it was written to while it was read), or a
    thing that is not one, never read (`link`: its target; `special`: fifo, socket, device)."""

    path: Required[str]
    size: int
    sha256: str
    mtime_ns: int
    changed: bool
    link: str
    special: str


class CategoryDoc(TypedDict):
    """One category of a storage review (agent/space.py)."""

    name: str
    regenerable: bool
    why: str
    bytes: int
    files: int
    oldest: float | None
    paths: list[list[Any]]  # regenerable ones: [path, size, mtime_ns, allocated bytes]


class SpaceDoc(TypedDict):
    total_bytes: int | None
    free_bytes: int | None


class StorageReview(TypedDict):
    """`python -m agent storage`: what fills the box, by category, and what a clean frees."""

    root: str
    disk: SpaceDoc
    categories: list[CategoryDoc]
    freeable_bytes: int
    rules_problem: str | None
    free_after_bytes: int | None


class PointerDoc(TypedDict):
    target: str
    sha256: str


class SwitchDoc(TypedDict):
    """`python -m agent switch`: how it ended, and what runs after it (a refusal because
    another switch holds the lock reads nothing back)."""

    outcome: SwitchOutcome
    reason: str | None
    previous: PointerDoc | None
    target: PointerDoc
    readback: NotRequired[ReadbackDoc]
