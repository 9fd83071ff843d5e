"""A one-shot job's file, `JOBDIR/job.json`, read and checked key by key.

A job directory is `<root>/jobs/<name>` (the agent's records, root's alone); the operator uploads
`job.json` there and the job's inputs to its work directory, `agent.contract.job_workdir`, outside
the root (`workdir/` below). Any problem with the file is one usage error (exit 2): nothing is
guessed.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from agent.base.errors import usage_error
from agent.contract import JOB_FILE, JOB_OUTCOME, JOB_STATE, JOBS, job_cache, job_workdir
from agent.job.gate_command import GRAMMAR, Unreadable, read_gate

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
REPO_TYPES = ("model", "dataset", "space")
TOP_KEYS = ("name", "command", "outputs", "ttl_minutes", "gates", "modules", "toolchain",
            "store_endpoint", "admission")
ADMISSION_KEYS = ("driver", "qualified_gpus", "banned_symbols", "allowed_symbols")
GATE_KEYS = ("name", "command", "min_passed")
TOOLCHAIN_KEYS = ("repo", "revision", "path", "repo_type")


@dataclass(frozen=True)
class Gate:
    name: str
    command: str
    min_passed: int


@dataclass(frozen=True)
class Toolchain:
    repo: str
    revision: str  # refused at fetch unless a 40-hex commit
    path: str  # where it appears under workdir/
    repo_type: str


@dataclass(frozen=True)
class JobAdmission:
    driver: str
    qualified_gpus: tuple[str, ...]
    banned_symbols: tuple[str, ...]
    allowed_symbols: tuple[str, ...]


@dataclass(frozen=True)
class Job:
    dir: Path
    name: str
    command: str
    outputs: str
    ttl_minutes: float
    gates: tuple[Gate, ...]
    modules: tuple[str, ...]
    toolchain: Toolchain | None
    store_endpoint: str | None
    admission: JobAdmission

    @property
    def root(self) -> Path:
        """The agent's root: JOBDIR is <root>/jobs/<name>."""
        return self.dir.parent.parent

    @property
    def work(self) -> Path:
        """Outside the root, where the job's user can reach it (agent.contract.job_workdir)."""
        return Path(job_workdir(str(self.root), self.name))

    @property
    def cache(self) -> Path:
        return Path(job_cache(str(self.root)))

    @property
    def outputs_dir(self) -> Path:
        return self.work / self.outputs

    @property
    def state_path(self) -> Path:
        return self.dir / JOB_STATE

    @property
    def outcome_path(self) -> Path:
        return self.dir / JOB_OUTCOME

    @property
    def log(self) -> Path:
        return self.dir / "job.log"

    @property
    def ttl_s(self) -> float:
        return self.ttl_minutes * 60.0


def load_job(jobdir: Path) -> Job:
    """JOBDIR/job.json, checked key by key: any problem is one usage error (exit 2)."""
    jobdir = Path(os.path.abspath(jobdir))
    path = jobdir / JOB_FILE
    if not jobdir.is_dir():
        raise usage_error(f"job directory {jobdir} not found")
    if jobdir.parent.name != JOBS:
        raise usage_error(f"{jobdir}: a job directory is <root>/jobs/<name>")
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise usage_error(f"{path} not found") from None
    except OSError as e:
        raise usage_error(f"{path} unreadable: {e.strerror}") from None
    except ValueError as e:
        raise usage_error(f"{path} is not JSON: {e}") from None
    return parse_job(raw, jobdir, str(path))


def parse_job(raw: Any, jobdir: Path, where: str) -> Job:
    """A job spec (what `job.json` holds), checked key by key, for the job directory `jobdir`:
    any problem is one usage error (exit 2). The operator checks the spec it is about to
    upload with this very function, so that a job the agent would refuse rents no box."""
    top = _keys(raw, TOP_KEYS, where)
    name = _string(top, "name", where)
    if not NAME.match(name) or name != jobdir.name:
        raise usage_error(f"{where}: name {name!r} must be the job directory's name "
                          f"({jobdir.name!r}) and match {NAME.pattern}")
    ttl = top["ttl_minutes"]
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) \
            or ttl <= 0:
        raise usage_error(f"{where}: ttl_minutes must be a positive number, got {ttl!r}")
    gates = []
    for i, g in enumerate(_list(top, "gates", where)):
        gw = f"{where}: gates[{i}]"
        gt = _keys(g, GATE_KEYS, gw)
        low = gt["min_passed"]
        if isinstance(low, bool) or not isinstance(low, int) or low < 1:
            # a gate that ran no test proves nothing
            raise usage_error(f"{gw}.min_passed must be a whole number >= 1, got {low!r}")
        command = _string(gt, "command", gw)
        check_gate_command(command, f"{gw}.command")
        gates.append(Gate(_string(gt, "name", gw), command, low))
    if len({g.name for g in gates}) != len(gates):
        raise usage_error(f"{where}: gate names must be unique")
    modules = tuple(_relative(m, f"{where}: modules[{i}]")
                    for i, m in enumerate(_strings(top, "modules", where)))
    outputs = _relative(_string(top, "outputs", where), f"{where}: outputs")
    toolchain = None
    if top["toolchain"] is not None:
        tw = f"{where}: toolchain"
        tt = _keys(top["toolchain"], TOOLCHAIN_KEYS, tw)
        repo_type = _string(tt, "repo_type", tw)
        if repo_type not in REPO_TYPES:
            raise usage_error(f"{tw}.repo_type must be one of {', '.join(REPO_TYPES)}, "
                              f"got {repo_type!r}")
        toolchain = Toolchain(_string(tt, "repo", tw), _string(tt, "revision", tw),
                              _relative(_string(tt, "path", tw), f"{tw}.path"), repo_type)
        if _overlap(outputs, toolchain.path):
            raise usage_error(f"{where}: outputs {outputs!r} and toolchain.path "
                              f"{toolchain.path!r} overlap: the outputs read back would hold "
                              "the toolchain, or the toolchain would hide them")
    endpoint = top["store_endpoint"]
    if endpoint is not None and not _url(endpoint):
        raise usage_error(f"{where}: store_endpoint must be null or an http(s) URL, "
                          f"got {endpoint!r}")
    aw = f"{where}: admission"
    at = _keys(_nvidia_only(top["admission"], aw), ADMISSION_KEYS, aw)
    admission = JobAdmission(_string(at, "driver", aw), tuple(_strings(at, "qualified_gpus", aw)),
                             tuple(_strings(at, "banned_symbols", aw)),
                             tuple(_strings(at, "allowed_symbols", aw)))
    return Job(jobdir, name, _string(top, "command", where), outputs, float(ttl),
               tuple(gates), modules, toolchain, endpoint, admission)


def check_gate_command(command: str, where: str) -> None:
    """A usage error (one line) unless the gate's command reads strictly
    (agent.job.gate_command): the operator checks its job file with this very rule."""
    try:
        read_gate(command)
    except Unreadable as e:
        raise usage_error(f"{where} {command!r} cannot be read strictly: {e}; {GRAMMAR}") \
            from None


def _overlap(a: str, b: str) -> bool:
    """True when one relative path is the other or lies inside it."""
    pa, pb = PurePosixPath(a).parts, PurePosixPath(b).parts
    n = min(len(pa), len(pb))
    return pa[:n] == pb[:n]


def _url(value: Any) -> bool:
    if not isinstance(value, str) or "\0" in value or value.strip() != value:
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _nvidia_only(raw: Any, where: str) -> Any:
    """A job's admission reads NVML only: an optional `vendor` other than "nvidia" is refused
    (an AMD job would otherwise be judged by a library its box does not have)."""
    if not isinstance(raw, dict) or "vendor" not in raw:
        return raw
    if raw["vendor"] != "nvidia":
        raise usage_error(f"{where}: vendor {raw['vendor']!r} is refused: one-shot jobs run on "
                          "NVIDIA GPUs only")
    return {k: v for k, v in raw.items() if k != "vendor"}


def _keys(raw: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise usage_error(f"{where} must be an object")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise usage_error(f"{where}: unknown key {unknown[0]!r}")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise usage_error(f"{where}: missing key {missing[0]!r}")
    return raw


def _string(t: dict[str, Any], key: str, where: str) -> str:
    value = t[key]
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise usage_error(f"{where}: {key} must be a non-empty string without NUL, "
                          f"got {value!r}")
    return value


def _list(t: dict[str, Any], key: str, where: str) -> list[Any]:
    value = t[key]
    if not isinstance(value, list):
        raise usage_error(f"{where}: {key} must be a list, got {value!r}")
    return value


def _strings(t: dict[str, Any], key: str, where: str) -> list[str]:
    values = _list(t, key, where)
    for v in values:
        if not isinstance(v, str) or not v.strip() or "\0" in v:
            raise usage_error(f"{where}: {key} must hold non-empty strings without NUL, "
                              f"got {v!r}")
    return values


def _relative(path: str, where: str) -> str:
    """A path (or glob) that stays inside workdir/: relative, no '..'."""
    p = PurePosixPath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts or path.strip() != path \
            or any(c < " " for c in path):
        raise usage_error(f"{where}: {path!r} must be a relative path inside workdir/ (no '..')")
    return path


class Refused(Exception):
    """A step's guard said no: recorded as the job's refusal."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def now() -> float:
    return round(time.time(), 3)
