"""The start hook: what a container restart runs so that the agent comes back by itself.

Every box gets ``<root>/boot.sh`` (start the agent unless it runs). Vast runs the instance's
``onstart`` at every container start, and the fleet rents with an onstart that calls boot.sh.
RunPod's images run ``/post_start.sh`` from their start script, so there it is written too.
The deploy writes these with ``box.file``.
"""

from __future__ import annotations

from operations.util import HOOKS


def boot_script(root: str) -> str:
    return (
        "#!/bin/sh\n"
        "# written by fleet: start the agent after a container (re)start\n"
        f"mkdir -p {root}/log && cd {root} || exit 0\n"
        f"exec venv/bin/python -m agent run --config {root}/agent.toml "
        f">>{root}/log/boot.log 2>&1\n"
    )


def hook_files(root: str, provider: str) -> dict[str, str]:
    """path -> content of every start-hook file a box of `provider` needs."""
    files = {f"{root}/boot.sh": boot_script(root)}
    for path in HOOKS.get(provider, ()):
        files[path] = f"#!/bin/sh\n# written by fleet\n[ -x {root}/boot.sh ] && {root}/boot.sh\n"
    return files
