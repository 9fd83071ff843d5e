"""
Operations for node releases on a box: the release's files under ``releases/<sha16>/`` and the
pointer ``standing.node`` (with ``standing.node.sha256`` beside it) that tells the agent which
node binary to run.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyinfra import host
from pyinfra.api import FileUploadCommand, OperationError, StringCommand, operation
from pyinfra.api.command import QuoteString

from agent.contract import (
    CONFIG,
    NODE,
    POINTER,
    POINTER_DIGEST,
    RELEASES,
    RELEASES_STAGED,
    ROOT,
    RUN,
    SWITCH_LOCK,
    VENV_PYTHON,
)
from facts.box import NodeReadback
from operations import script
from operations.util import box_state

# the shell programs (scripts/release_*.sh.j2), with the contract's names in place
_NAMES = {"POINTER": POINTER, "POINTER_DIGEST": POINTER_DIGEST, "RELEASES": RELEASES,
          "RELEASES_STAGED": RELEASES_STAGED, "RUN": RUN, "SWITCH_LOCK": SWITCH_LOCK}
# unpack a release and check it before it is renamed into place (with its staging record)
_UNPACK = script.render("release_unpack", **_NAMES)
# check a release already in place, file by file, naming any that differs
_VERIFY = script.render("release_verify", **_NAMES)
# write the pointer under the box's switch lock, its digest first
POINT_SCRIPT = script.render("release_point", **_NAMES)
POINT_LOCK_WAIT_S = 900  # as long as `agent switch` waits for another switch


@operation()
def present(tarball: str, sha16: str, sha256sums: str, root: str = ROOT,
            verify: bool = False):
    """
    Place a release's files under ``<root>/releases/<sha16>/``, checked against their digests.

    + tarball: local path of the release packed by ``fleet.boxes.deploy_support.release_tarball``
    + sha16: the release's node sha16 (its folder name on the box)
    + sha256sums: ``sha256sum``-format lines for every file of the release
    + root: the fleet's directory on the box
    + verify: check a folder that is already there too, and fail naming any file that differs

    **Example:**

    .. code:: python

        release.present(name="Stage 1.5.0", tarball=str(shipped.tarball),
                        sha16=rel.node_sha16, sha256sums=shipped.sha256sums, verify=True)
    """
    state = box_state(host, root)
    dest = f"{root}/{RELEASES}/{sha16}"
    if sha16 in state.get("releases", []):
        if verify:
            yield StringCommand("sh -c", QuoteString(_VERIFY), "verify", QuoteString(dest),
                                QuoteString(sha256sums))
            return
        host.noop(f"release {sha16} is present")
        return
    remote = f"/tmp/fleet-release-{sha16}.tar"
    yield FileUploadCommand(tarball, remote)
    yield StringCommand("sh -c", QuoteString(_UNPACK), "release",
                        QuoteString(dest), QuoteString(remote),
                        QuoteString(sha256sums))


@operation()
def pointer(node: str, sha256: str, root: str = ROOT, only_if_absent: bool = False):
    """
    Point the agent at a node binary: ``standing.node`` holds its path, ``standing.node.sha256``
    its digest (written first, so the agent never sees a path without its digest).

    + node: absolute path of the node binary on the box
    + sha256: the binary's full sha256
    + root: the fleet's directory on the box
    + only_if_absent: leave an existing pointer alone (a converted box keeps what it runs)
    """
    state = box_state(host, root)
    current = state.get("pointer")
    if current and only_if_absent:
        host.noop(f"pointer exists ({current}); left alone")
        return
    if current == node and state.get("pointer_sha256") == sha256:
        host.noop("pointer is current")
        return
    yield StringCommand("sh -c", QuoteString(POINT_SCRIPT), "pointer", QuoteString(root),
                        QuoteString(node), QuoteString(sha256),
                        "1" if only_if_absent else "0", str(POINT_LOCK_WAIT_S))


@operation()
def switched(node: str, sha256: str, stable_s: int = 60, deadline_s: int = 300,
             root: str = ROOT, older: Sequence[str] = (), downgrade: bool = False):
    """
    The node runs ``node`` (digest ``sha256``): the agent on the box writes the pointer, waits
    until the new node runs and stays synced for ``stable_s`` within ``deadline_s``, and puts
    the previous pointer back by itself when it does not (the command then fails: exit 3
    reverted, 4 failed, 1 refused). Compares with what the box *runs* (``NodeReadback``),
    never with the registry.

    + node: absolute path of the node binary on the box (staged by ``release.present``)
    + sha256: the binary's full sha256
    + stable_s: seconds the new node must stay synced
    + deadline_s: seconds from the pointer write for it to get there
    + root: the fleet's directory on the box
    + older: node digests of the releases this one may replace (not newer than it); a node
      running any other digest (a newer release, or one the store does not know) is ahead
      and left alone
    + downgrade: switch even a box that is ahead

    **Example:**

    .. code:: python

        release.switched(name="Switch to 1.5.0", node=f"{ROOT}/releases/{sha16}/igneumd",
                         sha256=rel.node_sha256, older=[r.node_sha256 for r in older])
    """
    readback = host.get_fact(NodeReadback, root=root)
    if not readback:
        raise OperationError(f"no agent answers under {root}; convert the box first "
                             "(deploys/standing.py)")
    running = (readback.get(NODE) or {}).get("sha256")
    if running == sha256:
        host.noop(f"node runs {sha256[:16]}")
        return
    if not running and not downgrade:
        raise OperationError("no node runs: what the box runs cannot be compared; not switching")
    if running and running not in older and not downgrade:
        host.noop(f"node runs {running[:16]}, not an older release: ahead, left alone")
        return
    yield StringCommand(
        "cd", QuoteString(root), "&&", f"{VENV_PYTHON} -m agent switch --config {CONFIG}",
        "--node", QuoteString(node), "--sha256", QuoteString(sha256),
        "--stable-s", str(int(stable_s)), "--deadline-s", str(int(deadline_s)),
    )
