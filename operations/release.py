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
from operations.util import box_state

# The staging record, <root>/releases.staged/<sha16> (by rename, so that a clean running now
# sees its folder change): the storage clean keeps the release (agent/space.py) until a switch
# points at it (agent/base/releases_record.py removes the record) or the operator removes it.
_STAGED = rf"""
rec="${{dest%/{RELEASES}/*}}/{RELEASES_STAGED}/${{dest##*/}}"
mkdir -p "${{rec%/*}}" && : > "$rec.new" && mv -f "$rec.new" "$rec"
"""

# Unpack into a temporary folder, check every file against the digests the operator sent, and
# only then rename the folder into place: a half-copied release never looks present.
_UNPACK = r"""
set -e
dest=$1 tarball=$2 sums=$3""" + _STAGED + r"""tmp="$dest.partial"
rm -rf "$tmp" && mkdir -p "$tmp"
tar -xf "$tarball" -C "$tmp"
cd "$tmp" && printf '%s' "$sums" | sha256sum -c --quiet -
rm -rf "$dest" && mv "$tmp" "$dest" && rm -f "$tarball"
"""

# A folder already in place is checked again, file by file: a staged file that changed on the
# box fails here, naming it, instead of being switched to.
_VERIFY = r"""
set -e
dest=$1 sums=$2""" + _STAGED + r"""cd "$dest"
if ! out=$(printf '%s' "$sums" | sha256sum -c --quiet - 2>&1); then
  printf '%s\n' "$out" | grep FAILED | sed "s|^|$dest/|" >&2
  echo "release files on the box differ from the release's digests" >&2
  exit 1
fi
"""

# Under the box's switch lock (the one `agent switch` holds for its whole life), so a deploy's
# write never interleaves with a switch; `only_if_absent` is decided there, on the pointer as
# it is then. The digest is written first, so the agent never sees a path without its digest.
POINT_SCRIPT = rf"""
set -e
root=$1 node=$2 sha=$3 only_if_absent=$4 wait_s=$5
mkdir -p "$root/{RUN}"
exec 9>>"$root/{RUN}/{SWITCH_LOCK}"
if ! flock -w "$wait_s" 9; then
  echo "another switch has held {RUN}/{SWITCH_LOCK} for $wait_s s; pointer not written" >&2
  exit 1
fi
if [ "$only_if_absent" = 1 ] && [ -e "$root/{POINTER}" ]; then
  echo "pointer exists; left alone"
  exit 0
fi
echo "$sha" > "$root/.{POINTER_DIGEST}.new"
echo "$node" > "$root/.{POINTER}.new"
mv -f "$root/.{POINTER_DIGEST}.new" "$root/{POINTER_DIGEST}"
mv -f "$root/.{POINTER}.new" "$root/{POINTER}"
"""
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
    process = readback.get(NODE)
    running = process.get("sha256") if process else None
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
