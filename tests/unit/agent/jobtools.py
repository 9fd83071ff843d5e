"""Test helpers for one-shot jobs: a job directory under a test box's root (its work directory
in the job area outside it), the agent's `job`
commands run for real (against the stand-in NVML), and modules to scan (built with gcc, and
NVIDIA fatbin containers assembled here byte by byte)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import struct
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from agentbox import DRIVER, PY, Box

from agent.contract import job_workdir

ELF_KIND, PTX_KIND = 2, 1
COMPRESSED = 0x2000


# the job's code runs as the job's user, who may not reach the test's own interpreter (it may
# live in root's home): a job's command runs the system's python3 with the test's packages
JOB_PY = (f"PYTHONPATH={shlex.quote(sysconfig.get_paths()['purelib'])} "
          f"{shutil.which('python3', path=os.defpath) or 'python3'}")


def job_dir(box: Box, name: str = "bench") -> Path:
    return box.root / "jobs" / name


def workdir(jobdir: Path) -> Path:
    """The job's work directory: outside the root, where the job's user can reach it."""
    return Path(job_workdir(str(jobdir.parent.parent), jobdir.name))


def write_job(box: Box, name: str = "bench", **overrides: Any) -> Path:
    """JOBDIR/job.json with a command that counts its runs in workdir/runs.txt; unless the
    test names its own modules, one clean PTX module (the role bans symbols, so a job must
    name modules to scan)."""
    jobdir = job_dir(box, name)
    jobdir.mkdir(parents=True, exist_ok=True)
    workdir(jobdir).mkdir(parents=True, exist_ok=True)
    if "modules" not in overrides:
        (workdir(jobdir) / "kernels").mkdir(exist_ok=True)
        (workdir(jobdir) / "kernels" / "clean.ptx").write_text(ptx("add_k"))
    admission = {"driver": DRIVER, "qualified_gpus": [],
                 "banned_symbols": ["cublas*", "*softmax*", "*tanh*", "*matrixmultiply*"],
                 "allowed_symbols": []}
    admission.update(overrides.pop("admission", {}))
    spec: dict[str, Any] = {
        "name": name, "command": "echo ran >> runs.txt && echo 42 > out/result.txt",
        "outputs": "out", "ttl_minutes": 30, "gates": [], "modules": ["kernels/*.ptx"],
        "toolchain": None,
        "store_endpoint": None, "admission": admission,
    }
    spec.update(overrides)
    (jobdir / "job.json").write_text(json.dumps(spec))
    return jobdir


def pytest_gate(name: str, passed: int = 1, *before: str) -> dict[str, Any]:
    """A gate whose output ends with pytest's summary line (`N passed in 0.01s`)."""
    shell = "; ".join([*before, f"echo '{passed} passed in 0.01s'"])
    return {"name": name, "command": shell, "min_passed": 1}


# the agent's view of cgroups, in a private mount namespace of its own (box.wrap): cgroup v2
# mounted where a v2 box has it, none at all, or one read-only (a container's usual view)
CGROUP_V2 = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             'umount -a -t cgroup2; mount -t cgroup2 none /sys/fs/cgroup && exec "$@"', "sh"]
NO_CGROUP_V2 = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'umount -a -t cgroup2; exec "$@"', "sh"]
READ_ONLY_CGROUP_V2 = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       'umount -a -t cgroup2; mount -t cgroup2 -o ro none /sys/fs/cgroup && '
                       'exec "$@"', "sh"]


def job(box: Box, step: str, jobdir: Path, *extra: str,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m agent job STEP JOBDIR` (in box.wrap's namespace), unchecked."""
    return subprocess.run([*box.wrap, PY, "-m", "agent", "job", step, *extra, str(jobdir)],
                          env=box.env(),
                          capture_output=True, text=True, timeout=timeout)


def state_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.stdout, f"no state printed (rc {done.returncode}): {done.stderr}"
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def step_ok(box: Box, step: str, jobdir: Path) -> dict[str, Any]:
    done = job(box, step, jobdir)
    assert done.returncode == 0, f"job {step}: rc {done.returncode}: {done.stderr}"
    return state_of(done)


def runs(jobdir: Path) -> int:
    """How many times the job's command ran (it appends a line to workdir/runs.txt)."""
    path = workdir(jobdir) / "runs.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def outcome(jobdir: Path) -> dict[str, Any]:
    """The agent's record of how the job ended (JOBDIR/outcome.json, outside its outputs)."""
    value = json.loads((jobdir / "outcome.json").read_text())
    assert isinstance(value, dict)
    return value


# ---------------------------------------------------------------- modules to scan


def gcc(tmp: Path, source: str, out: Path, *flags: str) -> Path:
    """Compile C source with gcc into out (flags: -shared -fPIC, or -c)."""
    src = tmp / f"{out.name}.c"
    src.write_text(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-O0", *flags, "-o", str(out), str(src)], check=True,
                   capture_output=True, text=True)
    return out


def fatbin_entry(kind: int, payload: bytes, flags: int = 0x11) -> bytes:
    """One fatbin entry: its 64-byte header (kind, version, header size, payload size, ...,
    flags at offset 40) and the payload padded to 8 bytes."""
    padded = payload + b"\0" * (-len(payload) % 8)
    header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, 64, len(padded), 0, 0, 8, 0, 90, 0, 0,
                         flags, 0, 0)
    assert len(header) == 64
    return header + padded


def fatbin(*entries: bytes) -> bytes:
    """A fatbin container: magic 0xBA55ED50, version 1, header size 16, size of the entries."""
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def ptx(entry: str, calls: str = "") -> str:
    """PTX text with one kernel (and a call to `calls`, declared as an extern function)."""
    extern = f".extern .func (.param .b32 r) {calls} (.param .b32 x);\n" if calls else ""
    call = (f"    {{ .param .b32 a; .param .b32 r; call.uni (r), {calls}, (a); }}\n"
            if calls else "")
    return (".version 8.5\n.target sm_90\n.address_size 64\n"
            f"// a comment naming cublasSgemm is not a use of it\n{extern}"
            f".visible .entry {entry}(\n    .param .u64 p0\n)\n{{\n{call}    ret;\n}}\n")


# ---------------------------------------------------------------- a toolchain in a store

HUB_TOKEN = "hf_sandbox_job_token_4f1c9a0e7d2b"
TOOLCHAIN_REPO = "fleet/toolchains"


def seed_toolchain(store: Any, files: dict[str, bytes], repo: str = TOOLCHAIN_REPO) -> str:
    """A dataset repository in the sandbox Hub's store holding `files`; the commit id."""
    from sandbox.hub.store import AddFile, HubError

    try:
        handle = store.create_repo("dataset", repo, True)
    except HubError:
        handle = store.repo("dataset", repo)
    commit = store.commit(handle, "main", None, "toolchain", "",
                          [AddFile(path, data) for path, data in files.items()])
    return str(commit.id)


def write_token(box: Box, token: str) -> None:
    path = box.root / "hf_token"
    path.write_text(token + "\n")
    path.chmod(0o600)
