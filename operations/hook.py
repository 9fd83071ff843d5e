"""The start hook: what a container restart runs so that the agent comes back by itself.

Every box gets ``<root>/boot.sh`` (start the agent unless it runs). The fleet rents every box
with a start command that calls it at every container start: Vast's ``onstart``, RunPod's
``dockerArgs`` (which then runs the image's ``/start.sh``). On RunPod the root is the pod's
volume, kept across restarts; a hook on its container disk would not be. The deploy writes
these with ``box.file``.
"""

from __future__ import annotations

from agent.contract import BOOT_LOG, BOOT_SCRIPT, CONFIG, LOGS, VENV_PYTHON


def boot_script(root: str) -> str:
    return (
        "#!/bin/sh\n"
        "# written by fleet: start the agent after a container (re)start\n"
        f"mkdir -p {root}/{LOGS} && cd {root} || exit 0\n"
        f"exec {VENV_PYTHON} -m agent run --config {root}/{CONFIG} "
        f">>{root}/{BOOT_LOG} 2>&1\n"
    )


def hook_files(root: str) -> dict[str, str]:
    """path -> content of every start-hook file a box needs (all under the fleet's root)."""
    return {f"{root}/{BOOT_SCRIPT}": boot_script(root)}
