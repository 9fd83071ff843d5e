"""The job's own code runs as the job's user, not as root: it can neither rewrite the agent's
records nor signal the agent's steps, and whatever it starts, even with a cleared environment
in a session of its own, dies with the step, since a uid is a mark no process can shed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from agentbox import Box
from jobtools import JOB_PY, job, runs, state_of, step_ok, workdir, write_job

from agent.contract import JOB_UID
from agent.job import jobuser

# tries to replace each record named on its command line; writes what happened to forged.json
FORGE = r'''
import json, os, sys
seen = {}
for path in sys.argv[1:]:
    try:
        state = json.load(open(path)) if os.path.exists(path) else {}
        state.update(phase="gated", invocations=0, exit_code=0)
        with open(path + ".x", "w") as f:
            json.dump(state, f)
        os.replace(path + ".x", path)
        seen[os.path.basename(path)] = "written"
    except OSError as e:
        seen[os.path.basename(path)] = type(e).__name__
json.dump(seen, open("forged.json", "w"))
'''
# a daemon that clears its environment and leaves the session, its pid in esc.pid
ESCAPE_PY = """
import os, subprocess, time
subprocess.Popen(["env", "-i", "setsid", "sh", "-c", "echo $$ > esc.pid; exec sleep 600"],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
while not (os.path.exists("esc.pid") and os.path.getsize("esc.pid")):
    time.sleep(0.05)
"""
# the job's code signals the step that runs it (the nearest ancestor running `agent job`: a
# gate's command runs under bash, its parent); what the kill did goes to kill.rc (0, or the
# errno's name), the step's argv to kill.step
KILL_STEP_PY = """
import errno, os, signal
pid = os.getppid()
while pid > 1:
    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    if b"agent" in argv and b"job" in argv:
        break
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
open("kill.step", "w").write(" ".join(a.decode() for a in argv if a))
try:
    os.kill(pid, signal.SIGKILL)
    rc = "0"
except OSError as e:
    rc = errno.errorcode[e.errno]
open("kill.rc", "w").write(rc + "\\n")
"""
# in a gate (read strictly: no background, no `$`, no `if`), both as scripts in the work directory
GATE_ESCAPE = f"{JOB_PY} escape.py; "
GATE_KILL_STEP = f"{JOB_PY} kill_step.py; "
# in the run's command (a shell's, not read as a gate's)
ESCAPE = ("env -i setsid sh -c 'echo $$ > esc.pid; exec sleep 600' </dev/null >/dev/null 2>&1 & "
          "while [ ! -s esc.pid ]; do sleep 0.05; done; ")
# the job's code signals the step that runs it; the outcome goes to kill.rc
KILL_PARENT = "if kill -9 $PPID 2>/dev/null; then echo 0 > kill.rc; else echo $? > kill.rc; fi; "


def through(box: Box, jobdir: Path, *steps: str) -> None:
    for step in steps:
        step_ok(box, step, jobdir)


def escaped_alive(jobdir: Path) -> bool:
    pid = int((workdir(jobdir) / "esc.pid").read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0600")


def kill_escaped(jobdir: Path) -> None:
    try:
        os.kill(int((workdir(jobdir) / "esc.pid").read_text()), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def test_a_gate_cannot_rewrite_the_agents_records_nor_kill_its_step(box: Box) -> None:
    jobdir = write_job(box)
    records = [str(jobdir / n) for n in ("state.json", "job.json", "outcome.json")]
    forge = (f"{JOB_PY} forge.py {' '.join(records)}; {GATE_KILL_STEP}sleep 5; "
             "echo '1 passed in 0.1s'")
    write_job(box, gates=[{"name": "g", "command": forge, "min_passed": 1}])
    (workdir(jobdir) / "forge.py").write_text(FORGE)
    (workdir(jobdir) / "kill_step.py").write_text(KILL_STEP_PY)
    through(box, jobdir, "admit", "fetch", "scan")
    first = job(box, "gate", jobdir)
    again = job(box, "gate", jobdir)  # a deploy's retry reads what the gate left
    done = job(box, "run", jobdir, "--wait")
    seen = json.loads((workdir(jobdir) / "forged.json").read_text())
    assert seen == {"state.json": "PermissionError", "job.json": "PermissionError",
                    "outcome.json": "PermissionError"}
    assert "gate" in (workdir(jobdir) / "kill.step").read_text().split()  # it aimed at its step
    assert (workdir(jobdir) / "kill.rc").read_text().strip() == "EPERM"  # not its to kill
    assert first.returncode == 0, first.stderr  # the gate passed honestly, nothing forged
    assert state_of(again)["phase"] == "gated"
    assert state_of(again)["gates"][0]["ok"] is True
    final = state_of(done)
    assert final["phase"] == "finished" and runs(jobdir) == 1


def test_a_daemon_that_clears_its_environment_dies_with_the_gate(box: Box) -> None:
    gate = f"{GATE_ESCAPE}{GATE_KILL_STEP}echo '1 passed in 0.1s'"
    jobdir = write_job(box, gates=[{"name": "g", "command": gate, "min_passed": 1}])
    (workdir(jobdir) / "escape.py").write_text(ESCAPE_PY)
    (workdir(jobdir) / "kill_step.py").write_text(KILL_STEP_PY)
    through(box, jobdir, "admit", "fetch", "scan")
    try:
        state = step_ok(box, "gate", jobdir)
        assert "gate" in (workdir(jobdir) / "kill.step").read_text().split()
        assert (workdir(jobdir) / "kill.rc").read_text().strip() == "EPERM"
        assert state["phase"] == "gated"
        assert not escaped_alive(jobdir)
        assert jobuser.holders() == []
        assert state["gates"][0]["killed"] >= 1
    finally:
        kill_escaped(jobdir)


def test_a_daemon_that_clears_its_environment_dies_with_the_run(box: Box) -> None:
    jobdir = write_job(box, command=f"{ESCAPE}{KILL_PARENT}echo ran >> runs.txt")
    through(box, jobdir, "admit", "fetch", "scan", "gate")
    try:
        done = job(box, "run", jobdir, "--wait")
        state = state_of(done)
        assert (workdir(jobdir) / "kill.rc").read_text().strip() != "0"
        assert state["phase"] == "finished" and runs(jobdir) == 1, done.stderr
        assert not escaped_alive(jobdir)
        assert jobuser.holders() == []
        assert state["killed"] >= 1
    finally:
        kill_escaped(jobdir)


def test_the_jobs_code_runs_as_the_job_user_without_roots_groups(box: Box) -> None:
    jobdir = write_job(box, command="id -u > out/uid; id -G > out/groups; echo $HOME > out/home")
    through(box, jobdir, "admit", "fetch", "scan", "gate")
    assert state_of(job(box, "run", jobdir, "--wait"))["phase"] == "finished"
    out = workdir(jobdir) / "out"
    assert (out / "uid").read_text().split() == [str(JOB_UID)]
    assert "0" not in (out / "groups").read_text().split()
    assert (out / "home").read_text().strip() == str(workdir(jobdir))
    assert (out / "uid").stat().st_uid == JOB_UID


def test_a_job_is_refused_at_admission_while_its_uid_is_taken(box: Box) -> None:
    import subprocess

    other = subprocess.Popen(["sleep", "600"], user=JOB_UID, group=JOB_UID, extra_groups=[])
    try:
        jobdir = write_job(box)
        done = job(box, "admit", jobdir)
        state = state_of(done)
        assert done.returncode == 3
        assert state["phase"] == "refused" and state["invocations"] == 0
        assert f"uid {JOB_UID} is in use" in state["refused"]["reason"]
        assert other.poll() is None  # not the job's: never killed
    finally:
        other.kill()
        other.wait()


def test_the_jobs_code_cannot_read_a_store_token_put_back_on_the_box(box: Box) -> None:
    token = box.root / "hf_token"
    jobdir = write_job(box, command=(
        f"while [ ! -e go ]; do sleep 0.05; done; if cat {token} > out/token 2>/dev/null; "
        f"then echo read > out/saw; else echo denied > out/saw; fi # {box.tmp}"))
    through(box, jobdir, "admit", "fetch", "scan", "gate")
    step_ok(box, "run", jobdir)
    token.write_text("hf_put_back_by_a_deploy\n")  # after the run's own removal of it
    token.chmod(0o600)
    (workdir(jobdir) / "go").touch()
    assert state_of(job(box, "run", jobdir, "--wait"))["phase"] == "finished"
    assert (workdir(jobdir) / "out" / "saw").read_text() == "denied\n"
    assert b"hf_put_back" not in (workdir(jobdir) / "out" / "token").read_bytes()
