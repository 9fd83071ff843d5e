"""The fleet's files are out of the job's way: the agent's records (the job's outcome, its state,
the spec it was given, its logs) live in the job directory, outside its work directory and its
outputs, and an output may carry any name, `fleet-job.json` included."""

from __future__ import annotations

import json
from pathlib import Path

from agentbox import Box
from jobtools import job, outcome, state_of, step_ok, workdir, write_job

MINE = '{"mine": true}'


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_an_output_named_like_the_agents_record_is_the_jobs_own(box: Box) -> None:
    jobdir = write_job(box, command=f"echo '{MINE}' > out/fleet-job.json && echo 42 > out/r.txt")
    for step in ("admit", "fetch", "scan", "gate"):
        step_ok(box, step, jobdir)
    done = job(box, "run", jobdir, "--wait")
    assert done.returncode == 0, done.stderr
    assert json.loads((workdir(jobdir) / "out" / "fleet-job.json").read_text()) == \
        json.loads(MINE)
    assert files_under(workdir(jobdir) / "out") == {"fleet-job.json", "r.txt"}
    assert outcome(jobdir)["invocations"] == 1  # the agent's record, beside the job's files


def test_a_refusal_or_a_stop_writes_nothing_into_the_outputs(box: Box) -> None:
    refused = write_job(box, "refused", admission={"driver": "1.2.3"})
    stopped = write_job(box, "stopped")
    for jobdir in (refused, stopped):
        (workdir(jobdir) / "out").mkdir()
        (workdir(jobdir) / "out" / "fleet-job.json").write_text(MINE)
    assert job(box, "admit", refused).returncode == 3
    assert state_of(job(box, "stop", stopped))["phase"] == "interrupted"
    for jobdir in (refused, stopped):
        assert (workdir(jobdir) / "out" / "fleet-job.json").read_text() == MINE
        assert files_under(workdir(jobdir) / "out") == {"fleet-job.json"}
        assert outcome(jobdir)["invocations"] == 0


def test_a_refused_job_leaves_an_empty_outputs_folder_to_read_back(box: Box) -> None:
    jobdir = write_job(box, admission={"driver": "1.2.3"})
    assert job(box, "admit", jobdir).returncode == 3
    assert (workdir(jobdir) / "out").is_dir()
    assert files_under(workdir(jobdir)) == {"kernels/clean.ptx"}
