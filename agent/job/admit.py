"""`job admit`: the exact driver and the qualified GPUs, through NVML (agent.base.gpu).

`job run` checks admission again just before the command starts: the driver may have changed.
"""

from __future__ import annotations

from typing import Any

from agent.job.model import Job, Refused


def admit(job: Job, state: dict[str, Any]) -> None:
    from agent.job.jobuser import refuse_if_taken

    refuse_if_taken()
    admission = check_admission(job)
    state["admission"] = admission
    if not admission["admitted"]:
        raise Refused(admission["reason"])


def check_admission(job: Job) -> dict[str, Any]:
    """The admission verdict, as recorded in the state."""
    from agent.base.gpu import admit as admit_gpus
    from agent.base.gpu import read_gpu

    a = job.admission
    return admit_gpus(read_gpu(), a.driver, list(a.qualified_gpus)).as_dict()
