"""The start hook: what a container restart runs so that the agent comes back by itself.

Every box gets ``<root>/boot.sh`` (start the agent unless it runs). The fleet rents every box
with a start command that calls it at every container start: Vast's ``onstart``, RunPod's
``dockerArgs`` (which then runs the image's ``/start.sh``). On RunPod the root is the pod's
volume, kept across restarts; a hook on its container disk would not be. The deploy writes
these with ``box.file``.
"""

from __future__ import annotations


def boot_script(root: str) -> str:
    return (
        "#!/bin/sh\n"
        "# written by fleet: start the agent after a container (re)start\n"
        f"mkdir -p {root}/log && cd {root} || exit 0\n"
        f"exec venv/bin/python -m agent run --config {root}/agent.toml "
        f">>{root}/log/boot.log 2>&1\n"
    )


def hook_files(root: str) -> dict[str, str]:
    """path -> content of every start-hook file a box needs (all under the fleet's root)."""
    return {f"{root}/boot.sh": boot_script(root)}
