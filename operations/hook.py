"""The start hook: what a container restart runs so that the agent comes back by itself.

Every box gets ``<root>/boot.sh`` (start the agent unless it runs). The fleet rents every box
with a start command that calls it at every container start: Vast's ``onstart``, RunPod's
``dockerArgs`` (which then runs the image's ``/start.sh``). On RunPod the root is the pod's
volume, kept across restarts; a hook on its container disk would not be. The deploy writes
these with ``box.file``.
"""

from __future__ import annotations

from agent.contract import BOOT_LOG, BOOT_SCRIPT, CONFIG, LOGS, VENV_PYTHON
from operations import script


def boot_script(root: str) -> str:
    """``boot.sh`` for a box whose fleet root is ``root`` (scripts/boot.sh.j2)."""
    return script.render("boot", root=root, BOOT_LOG=BOOT_LOG, CONFIG=CONFIG, LOGS=LOGS,
                         VENV_PYTHON=VENV_PYTHON)


def hook_files(root: str) -> dict[str, str]:
    """path -> content of every start-hook file a box needs (all under the fleet's root)."""
    return {f"{root}/{BOOT_SCRIPT}": boot_script(root)}
