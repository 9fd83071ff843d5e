"""A job the box's agent would refuse never rents a box: the same bad job files, fed to the
operator's parser (fleet/job.py, with the role's rule) and to the agent's steps (as the `job.json`
the deploy would write), are refused by both."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from agentbox import DRIVER, Box
from jobtools import job, ptx, runs, workdir

from fleet.core.config import Role
from fleet.core.errors import UsageError
from fleet.core.job import load

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROLE = Role("bench", "oneshot", "img", 20, admitted_driver=DRIVER,
            banned_symbols=("cublas*", "*softmax*"))
GOOD = """
name = "bench"
command = "echo ran >> runs.txt"
outputs = "out"
ttl_minutes = 30
modules = ["kernels/*.ptx"]
[[gates]]
name = "parity"
command = "echo '3 passed in 0.01s'"
min_passed = 3
"""
TOOLCHAIN = f'\n[toolchain]\nrepo = "fleet/toolchains"\nrevision = "{COMMIT}"\n'

BAD = {
    "empty gate command": ('command = "echo \'3 passed in 0.01s\'"', 'command = ""'),
    "blank gate command": ('command = "echo \'3 passed in 0.01s\'"', 'command = "  "'),
    "blank gate name": ('name = "parity"', 'name = " "'),
    "no test wanted": ("min_passed = 3", "min_passed = 0"),
    "outputs with a trailing space": ('outputs = "out"', 'outputs = "out "'),
    "outputs with a leading space": ('outputs = "out"', 'outputs = " out"'),
    "a module with a trailing space": ('["kernels/*.ptx"]', '["kernels/*.ptx "]'),
    "a blank module": ('["kernels/*.ptx"]', '["kernels/*.ptx", " "]'),
    "no modules where the role bans symbols": ('["kernels/*.ptx"]', "[]"),
    "a toolchain path with a trailing space": (TOOLCHAIN, TOOLCHAIN + 'path = "tc "\n'),
    "a toolchain repo the agent cannot name": (TOOLCHAIN, TOOLCHAIN.replace(
        "fleet/toolchains", "fleet/-toolchains")),
    "a toolchain repo with a double dash": (TOOLCHAIN, TOOLCHAIN.replace(
        "fleet/toolchains", "fleet--x/toolchains")),
    "a NUL in outputs": ('outputs = "out"', 'outputs = "o\\u0000ut"'),
    "a NUL in a gate command": ("command = \"echo '3 passed in 0.01s'\"",
                                "command = \"echo '3 passed in 0.01s' \\u0000\""),
    "a NUL in a module": ('["kernels/*.ptx"]', '["kernels/*.ptx", "k\\u0000"]'),
    "a gate that turns errexit off": ("command = \"echo '3 passed in 0.01s'\"",
                                      "command = \"set +e; echo '3 passed in 0.01s'\""),
    "a gate that turns errexit off behind a backslash": (
        "command = \"echo '3 passed in 0.01s'\"",
        "command = \"s\\\\et +e; false; echo '3 passed in 0.01s'\""),
    "a gate that hides a failure behind ||": (
        "command = \"echo '3 passed in 0.01s'\"",
        "command = \"false || true; echo '3 passed in 0.01s'\""),
    "a gate that hides a failure in a nested shell": (
        "command = \"echo '3 passed in 0.01s'\"",
        "command = \"sh -c 'false; echo 3 passed in 0.01s'\""),
    "a gate that hides a failure in an if": (
        "command = \"echo '3 passed in 0.01s'\"",
        "command = \"if false; then :; fi; echo '3 passed in 0.01s'\""),
    "outputs equal to the toolchain path": (TOOLCHAIN, TOOLCHAIN + 'path = "out"\n'),
    "outputs inside the toolchain path": ('outputs = "out"', 'outputs = "toolchain/out"'),
    "the toolchain path inside outputs": (TOOLCHAIN, TOOLCHAIN + 'path = "out/tc"\n'),
}
# the role's admission policy, as fleet.toml gives it, and the store the boxes reach
BAD_ROLES = {
    "an empty banned symbol": {"banned_symbols": ("cublas*", "")},
    "an empty qualified GPU": {"qualified_gpus": ("",)},
    "an empty allowed symbol": {"allowed_symbols": ("",)},
    "a NUL in the driver": {"admitted_driver": DRIVER + "\0"},
    "a store endpoint without a scheme": {"endpoint": "store.example:8080"},
}


def text(case: str | None) -> str:
    base = GOOD + (TOOLCHAIN if case and "toolchain" in case else "")
    if case is None:
        return base
    old, new = BAD[case]
    assert old in base, case
    return base.replace(old, new, 1)


def fleet_refuses(tmp: Path, toml: str, role: Role = ROLE,
                  endpoint: str = "http://127.0.0.1:9") -> str | None:
    """What `fleet run` says before it rents (None: it would rent), with the inputs the
    agent's work directory holds (agent_outcome)."""
    (tmp / "inputs" / "kernels").mkdir(parents=True, exist_ok=True)
    (tmp / "inputs" / "kernels" / "clean.ptx").write_text(ptx("add_k"))
    path = tmp / "job.toml"
    path.write_text(toml.replace("ttl_minutes = 30\n", 'ttl_minutes = 30\ninputs = "inputs"\n', 1))
    try:
        load(path).box_spec(role, endpoint)
    except UsageError as e:
        return str(e)
    return None


def agent_spec(toml: str, role: Role = ROLE, endpoint: str = "http://127.0.0.1:9"
               ) -> dict[str, Any]:
    """The job.json the deploy writes (Job.box_spec), made here without fleet's checks."""
    data = tomllib.loads(toml)
    t = data.get("toolchain")
    return {
        "name": data["name"], "command": data["command"], "outputs": data["outputs"],
        "ttl_minutes": data["ttl_minutes"],
        "gates": [{"name": g["name"], "command": g["command"],
                   "min_passed": g.get("min_passed", 1)} for g in data.get("gates", [])],
        "modules": data.get("modules", []),
        "toolchain": None if t is None else {"repo": t["repo"], "revision": t["revision"],
                                             "path": t.get("path", "toolchain"),
                                             "repo_type": "dataset"},
        "store_endpoint": None if t is None else endpoint,
        "admission": {"driver": role.admitted_driver, "qualified_gpus": list(role.qualified_gpus),
                      "banned_symbols": list(role.banned_symbols),
                      "allowed_symbols": list(role.allowed_symbols)},
    }


def agent_outcome(box: Box, toml: str, role: Role = ROLE,
                  endpoint: str = "http://127.0.0.1:9") -> tuple[str, int]:
    """(the step that stopped the job, its exit status), or ("run", 0) when it ran."""
    jobdir = box.root / "jobs" / "bench"
    jobdir.mkdir(parents=True, exist_ok=True)
    (workdir(jobdir) / "kernels").mkdir(parents=True, exist_ok=True)
    (workdir(jobdir) / "kernels" / "clean.ptx").write_text(ptx("add_k"))
    (jobdir / "job.json").write_text(json.dumps(agent_spec(toml, role, endpoint)))
    for step in ("admit", "fetch", "scan", "gate", "run"):
        done = job(box, step, jobdir, *(["--wait"] if step == "run" else []))
        if done.returncode != 0:
            assert done.returncode in (2, 3) and "Traceback" not in done.stderr, done.stderr
            return step, done.returncode
    return "run", 0


def test_the_good_job_passes_both(box: Box, tmp_path: Path) -> None:
    assert fleet_refuses(tmp_path, text(None)) is None
    assert agent_outcome(box, text(None)) == ("run", 0)
    assert runs(box.root / "jobs" / "bench") == 1


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_job_the_agent_refuses_is_refused_before_renting(box: Box, tmp_path: Path,
                                                           case: str) -> None:
    toml = text(case)
    step, code = agent_outcome(box, toml)
    assert step != "run" and code in (2, 3), (case, step, code)
    assert runs(box.root / "jobs" / "bench") == 0
    why = fleet_refuses(tmp_path, toml)
    assert why is not None, f"fleet/job.py accepts a job the agent refuses at {step}: {case}"
    assert "\n" not in why


@pytest.mark.parametrize("case", sorted(BAD_ROLES))
def test_a_role_policy_the_agent_refuses_is_refused_before_renting(box: Box, tmp_path: Path,
                                                                   case: str) -> None:
    change = dict(BAD_ROLES[case])
    endpoint = str(change.pop("endpoint", "http://127.0.0.1:9"))
    role = replace(ROLE, **change)
    toml = text(None) + TOOLCHAIN  # the endpoint is the toolchain's store
    step, code = agent_outcome(box, toml, role, endpoint)
    assert step != "run" and code in (2, 3), (case, step, code)
    assert runs(box.root / "jobs" / "bench") == 0
    why = fleet_refuses(tmp_path, toml, role, endpoint)
    assert why is not None, f"fleet run rents for a role policy the agent refuses: {case}"
    assert "\n" not in why
