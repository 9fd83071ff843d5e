"""
Run one job on the inventory's one-shot boxes: install the agent, stage the job, then admission,
toolchain, scan, gates and the run, each through the agent's CLI on the box.

    pyinfra -y inventory.py --limit LABEL deploys/oneshot.py --data job=JOB.toml

The agent refuses every step after a refusal (a wrong driver, an unqualified GPU, a banned
symbol, a failing gate), so a refused job records zero invocations and this deploy fails for
that box with the reason. Run it again and nothing changes: each step is done once. The box's
outputs are read back and the box destroyed by `fleet teardown LABEL` (deploys/teardown.py).
Standing boxes are refused.
"""

import json

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from agent.contract import ROOT
from fleet.boxes import deploy_results as results
from fleet.boxes import deploy_support as support
from fleet.ops.oneshot import mark_job
from operations import agent, job

STEP_NAMES = {"admit": "Admission: driver and GPUs", "fetch": "Toolchain from the store",
              "scan": "Banned-mechanism scan", "gate": "Gates", "run": "Job run"}


@deploy("One-shot job")
def oneshot() -> None:
    results.record_into(host.data.get("results_dir"))
    if host.data.get("kind") != "oneshot":
        results.refuse(f"{host.name} is a {host.data.get('kind')} box; jobs run on one-shot "
                       "boxes only", name="Refuse standing box")
        return
    job_file = host.data.get("job")
    if not job_file:
        results.refuse("no job file: pass --data job=JOB.toml", name="Refuse without a job")
        return
    spec_job = support.job(str(job_file))
    role = support.config().role(host.data.role)
    spec = spec_job.box_spec(role, support.store_endpoint())
    bundle = support.agent_bundle()
    if (host.data.get("job_name"), host.data.get("job_outputs")) != \
            (spec_job.name, spec_job.outputs):
        python.call(name="Registry: job and TTL", function=mark_job, label=host.name,
                    job=spec_job.name, ttl_minutes=spec_job.ttl_minutes,
                    gates=len(spec_job.gates), outputs=spec_job.outputs)

    agent.installed(name="Agent installed", bundle=str(bundle.path),
                    bundle_sha256=bundle.sha256, root=ROOT)
    known = job.read(spec_job.name, root=ROOT)  # once: every step decides from the same read
    job.staged(name=f"Job {spec_job.name} staged", job_name=spec_job.name,
               spec=json.dumps(spec, indent=1) + "\n",
               inputs=support.job_inputs(str(job_file)), root=ROOT, job_state=known)
    if spec_job.toolchain is not None:
        secret = support.store_token()
        if secret:
            job.token(name="Store token", job_name=spec_job.name, value=secret, root=ROOT,
                      job_state=known)
    for step in job.STEPS:
        job.stepped(name=STEP_NAMES[step], job_name=spec_job.name, step=step,
                    root=ROOT, job_state=known)


oneshot()
