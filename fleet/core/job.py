"""A one-shot job file (TOML): what to run on a one-shot box, and what it must leave behind.

    name = "matmul-bench"                 # letters, digits, dashes; names the job on the box
    command = "python3 run.py --out out"  # run once on the box, in the job's work directory
    outputs = "out"                        # directory under the work directory, read back
    ttl_minutes = 30                       # the box is flagged (and torn down) past this
    inputs = "bench-inputs"                # optional: local folder copied into the work dir
    modules = ["toolchain/kernels/*.cubin"]  # compiled GPU modules, scanned first (required
                                           # where the role bans symbols)
    card = "RTX 4090"                      # optional: the card to rent (default: cheapest)
    gpus = 1                               # optional
    provider = "vast"                      # optional
    [toolchain]                            # optional: fetched from the store at a commit
    repo = "fleet/toolchains"
    revision = "<40-hex commit>"           # a branch name is refused: the job must be exact
    path = "toolchain"                     # where it appears in the work directory
    [[gates]]                              # optional: must pass before the job runs
    name = "parity"
    command = "python3 -m pytest -q parity"
    min_passed = 12                        # optional, at least 1 (default 1)

A gate's command must read strictly (simple commands joined by `;`, `&&`, `|` and newlines:
agent/job/gate_command.py, the agent's own reader, checks it as the file is loaded). A gate
passes only when what was read exits 0 under `bash -e -o pipefail`, its output ends with
pytest's summary line, no summary in it reports a failed or error test, and they report at
least `min_passed` passed tests (the agent's rule, agent/job/gates.py).

Every mistake is one `UsageError` line naming the file and the key (exit 2, nothing rented).
`check_role` puts the job and the role's admission policy through the box's agent's own parser
(agent/job/model.py) on the `job.json` the deploy would upload, and the inputs folder through
the agent's rules for what the work directory may hold (agent/job/inputs.py), so that a job the
agent would refuse never rents a box.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from agent.base.errors import AgentError
from agent.contract import JOBS, ROOT
from agent.job.model import check_gate_command
from fleet.core import cards
from fleet.core.config import PROVIDERS, Role, read_toml
from fleet.core.errors import UsageError

NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
COMMIT = re.compile(r"[0-9a-f]{40}")
REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")  # the agent's form
MAX_TTL_MINUTES = 7 * 24 * 60


@dataclass(frozen=True)
class Gate:
    name: str
    command: str
    min_passed: int = 1


@dataclass(frozen=True)
class Toolchain:
    repo: str
    revision: str
    path: str = "toolchain"


@dataclass(frozen=True)
class Job:
    path: Path
    name: str
    command: str
    outputs: str
    ttl_minutes: int
    inputs: Path | None = None
    modules: tuple[str, ...] = ()
    gates: tuple[Gate, ...] = ()
    toolchain: Toolchain | None = None
    card: str | None = None
    gpus: int = 1
    provider: str | None = None

    def check_role(self, role: Role, store_endpoint: str | None = None) -> None:
        """The job with the role's admission policy, checked by the box's agent's own rules
        (agent.job.model.parse_job, on the very `job.json` the deploy would upload): whatever
        the agent would refuse is refused here, before a box is rented. Where the role bans
        symbols, the job names the modules to scan (the agent refuses it at its scan
        otherwise), and the role admits an exact driver."""
        from agent.base.errors import AgentError
        from agent.job.model import parse_job

        if not role.admitted_driver:
            raise UsageError(f"role {role.name} names no admitted_driver: a one-shot job runs "
                             "only on the admitted driver")
        if self.card and cards.vendor(self.card) != cards.NVIDIA:
            raise UsageError(f"{self.path}: card: {self.card} is not an NVIDIA card; one-shot "
                             "jobs run on NVIDIA cards only")
        if role.banned_symbols and not self.modules:
            raise UsageError(f"{self.path}: modules: role {role.name} bans symbols "
                             f"({', '.join(role.banned_symbols)}), so the job must name its "
                             "compiled modules to scan")
        try:
            parse_job(self._spec(role, store_endpoint), Path(ROOT, JOBS, self.name),
                      f"{self.path} (role {role.name})")
        except AgentError as e:
            raise UsageError(str(e)) from None
        self.check_inputs()

    def input_files(self) -> list[Path]:
        """The inputs the box receives: regular files, neither links nor under a linked
        folder (the upload sends these alone, and the checks read these alone)."""
        if self.inputs is None:
            return []
        found = []
        for top, _, files in os.walk(self.inputs):  # a linked folder is listed, not walked
            for name in files:
                path = Path(top) / name
                if path.is_file() and not path.is_symlink():
                    found.append(path)
        return sorted(found)

    def check_inputs(self) -> None:
        """The inputs as the box's work directory will hold them (input_files, laid out in a
        scratch folder) put through the rules the agent applies at its steps
        (agent.job.inputs): the toolchain's place, module globs that match nothing (those the
        toolchain cannot add to), the outputs folder's place. No inputs: an empty work
        directory."""
        from agent.job import inputs as rules

        with tempfile.TemporaryDirectory() as scratch:
            work = Path(scratch)
            for path in self.input_files():
                assert self.inputs is not None
                copy = work / path.relative_to(self.inputs)
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.touch()
            problem = (rules.toolchain_place(work, self.toolchain.path) if self.toolchain
                       else None) \
                or rules.unmatched_module(work, self.modules,
                                          self.toolchain.path if self.toolchain else None) \
                or rules.outputs_place(work, self.outputs)
        if problem is not None:
            raise UsageError(f"{self.path}: inputs: {problem} (the box's agent would refuse "
                             "the job)")

    def box_spec(self, role: Role, store_endpoint: str | None) -> dict[str, Any]:
        """The job as the box's agent reads it (`job.json`): the job plus the role's
        admission policy; never a key or a token. Refused (UsageError) where the agent would
        refuse it."""
        self.check_role(role, store_endpoint)
        return self._spec(role, store_endpoint)

    def _spec(self, role: Role, store_endpoint: str | None) -> dict[str, Any]:
        return {
            "name": self.name, "command": self.command, "outputs": self.outputs,
            "ttl_minutes": self.ttl_minutes,
            "gates": [{"name": g.name, "command": g.command, "min_passed": g.min_passed}
                      for g in self.gates],
            "modules": list(self.modules),
            "toolchain": None if self.toolchain is None else {
                "repo": self.toolchain.repo, "revision": self.toolchain.revision,
                "path": self.toolchain.path, "repo_type": "dataset"},
            "store_endpoint": store_endpoint if self.toolchain else None,
            "admission": {
                "driver": role.admitted_driver, "qualified_gpus": list(role.qualified_gpus),
                "banned_symbols": list(role.banned_symbols),
                "allowed_symbols": list(role.allowed_symbols)},
        }


_SPEC: dict[str, tuple[type, ...]] = {
    "name": (str,), "command": (str,), "outputs": (str,), "ttl_minutes": (int,),
    "inputs": (str,), "modules": (list,), "gates": (list,), "toolchain": (dict,),
    "card": (str,), "gpus": (int,), "provider": (str,),
}


def _check(where: str, table: dict[str, Any], spec: dict[str, tuple[type, ...]],
           required: tuple[str, ...]) -> None:
    for key, value in table.items():
        if key not in spec:
            raise UsageError(f"{where}: unknown key {key!r} (known: {', '.join(spec)})")
        types = spec[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            names = " or ".join(t.__name__ for t in types)
            raise UsageError(f"{where}.{key}: expected {names}, got {type(value).__name__}")
    for key in required:
        if key not in table:
            raise UsageError(f"{where}: missing key {key!r}")


def _text(where: str, value: str) -> str:
    if not value.strip():
        raise UsageError(f"{where}: is empty")
    return value


def _relative(where: str, value: str) -> str:
    """A path inside the work directory: relative, no `..`, not empty, no whitespace at its
    ends (the agent refuses those)."""
    p = PurePosixPath(value)
    if not value.strip() or value.strip() != value or p.is_absolute() or ".." in p.parts \
            or str(p) == ".":
        raise UsageError(f"{where}: {value!r} must be a path inside the work directory "
                         "(relative, without '..')")
    return str(p)


def parse(data: dict[str, Any], path: Path) -> Job:
    src = str(path)
    _check(src, data, _SPEC, ("name", "command", "outputs", "ttl_minutes"))
    name = data["name"]
    if not NAME.fullmatch(name):
        raise UsageError(f"{src}: name {name!r}: lowercase letters, digits and dashes, "
                         "at most 40")
    if not data["command"].strip():
        raise UsageError(f"{src}: command is empty")
    ttl = data["ttl_minutes"]
    if not 0 < ttl <= MAX_TTL_MINUTES:
        raise UsageError(f"{src}: ttl_minutes must be 1 to {MAX_TTL_MINUTES}, got {ttl}")
    modules = _modules(src, data)
    gates = _gates(src, data)
    toolchain = _toolchain(f"{src}: toolchain", data["toolchain"]) if "toolchain" in data \
        else None
    inputs = _inputs(src, data, path)
    provider, gpus, card = _placement(src, data)
    return Job(path=path, name=name, command=data["command"],
               outputs=_relative(f"{src}: outputs", data["outputs"]), ttl_minutes=ttl,
               inputs=inputs, modules=modules, gates=gates, toolchain=toolchain,
               card=card, gpus=gpus, provider=provider)


def _modules(src: str, data: dict[str, Any]) -> tuple[str, ...]:
    modules = []
    for i, m in enumerate(data.get("modules", [])):
        if not isinstance(m, str):
            raise UsageError(f"{src}: modules[{i}]: expected a glob string, got {m!r}")
        modules.append(_relative(f"{src}: modules[{i}]", m))
    return tuple(modules)


def _gates(src: str, data: dict[str, Any]) -> tuple[Gate, ...]:
    gates = tuple(_gate(f"{src}: gates[{i}]", g) for i, g in enumerate(data.get("gates", [])))
    if len({g.name for g in gates}) != len(gates):
        raise UsageError(f"{src}: gates: two gates share a name")
    return gates


def _gate(where: str, g: Any) -> Gate:
    if not isinstance(g, dict):
        raise UsageError(f"{where}: expected a table ([[gates]])")
    _check(where, g, {"name": (str,), "command": (str,), "min_passed": (int,)},
           ("name", "command"))
    if g.get("min_passed", 1) < 1:
        raise UsageError(f"{where}.min_passed: must be 1 or more (a gate that ran no test "
                         "proves nothing)")
    command = _text(f"{where}.command", g["command"])
    try:
        check_gate_command(command, f"{where}.command")
    except AgentError as e:
        raise UsageError(str(e)) from None
    return Gate(_text(f"{where}.name", g["name"]), command, g.get("min_passed", 1))


def _toolchain(where: str, t: dict[str, Any]) -> Toolchain:
    _check(where, t, {"repo": (str,), "revision": (str,), "path": (str,)},
           ("repo", "revision"))
    if not REPO.fullmatch(t["repo"]) or "--" in t["repo"]:
        raise UsageError(f"{where}.repo: {t['repo']!r} is not a repository id (ns/name)")
    if not COMMIT.fullmatch(t["revision"]):
        raise UsageError(f"{where}.revision: {t['revision']!r} is not a commit (40 hex "
                         "digits); a branch or tag can move, so it is refused")
    return Toolchain(t["repo"], t["revision"],
                     _relative(f"{where}.path", t.get("path", "toolchain")))


def _inputs(src: str, data: dict[str, Any], path: Path) -> Path | None:
    if "inputs" not in data:
        return None
    inputs: Path = (path.parent / data["inputs"]).resolve()
    if not inputs.is_dir():
        raise UsageError(f"{src}: inputs: {data['inputs']!r} is not a folder "
                         f"(relative to the job file)")
    return inputs


def _placement(src: str, data: dict[str, Any]) -> tuple[str | None, int, str | None]:
    """(provider, gpus, card) the job asks for; a card by any of its names, canonical."""
    provider = data.get("provider")
    if provider is not None and provider not in PROVIDERS:
        raise UsageError(f"{src}: provider: expected one of {', '.join(PROVIDERS)}, "
                         f"got {provider!r}")
    gpus = data.get("gpus", 1)
    if gpus < 1:
        raise UsageError(f"{src}: gpus must be at least 1")
    card = data.get("card")
    if card is not None:
        named = cards.canonical(card)
        if named is None:
            raise UsageError(f"{src}: card: unknown card {card!r} (known: {cards.known()})")
        card = named
    return provider, gpus, card


def load(path: Path) -> Job:
    return parse(read_toml(path, "no such job file", UsageError), path.resolve())
