"""
Operations for node releases on a box: the release's files under ``releases/<sha16>/`` and the
pointer ``standing.node`` (with ``standing.node.sha256`` beside it) that tells the agent which
node binary to run.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.api.command import QuoteString

from operations.util import box_state

# Unpack into a temporary folder, check every file against the digests the operator sent, and
# only then rename the folder into place: a half-copied release never looks present.
_UNPACK = r"""
set -e
dest=$1 tarball=$2 sums=$3
tmp="$dest.partial"
rm -rf "$tmp" && mkdir -p "$tmp"
tar -xf "$tarball" -C "$tmp"
cd "$tmp" && printf '%s' "$sums" | sha256sum -c --quiet -
rm -rf "$dest" && mv "$tmp" "$dest" && rm -f "$tarball"
"""

_POINT = r"""
set -e
root=$1 node=$2 sha=$3
echo "$sha" > "$root/.standing.node.sha256.new"
echo "$node" > "$root/.standing.node.new"
mv -f "$root/.standing.node.sha256.new" "$root/standing.node.sha256"
mv -f "$root/.standing.node.new" "$root/standing.node"
"""


@operation()
def present(tarball: str, sha16: str, sha256sums: str, root: str = "/root/fleet"):
    """
    Place a release's files under ``<root>/releases/<sha16>/``, checked against their digests.

    + tarball: local path of the release packed by ``fleet.deploy_support.release_tarball``
    + sha16: the release's node sha16 (its folder name on the box)
    + sha256sums: ``sha256sum``-format lines for every file of the release
    + root: the fleet's directory on the box
    """
    state = box_state(host, root)
    if sha16 in state.get("releases", []):
        host.noop(f"release {sha16} is present")
        return
    remote = f"/tmp/fleet-release-{sha16}.tar"
    yield FileUploadCommand(tarball, remote)
    yield StringCommand("sh -c", QuoteString(_UNPACK), "release",
                        QuoteString(f"{root}/releases/{sha16}"), QuoteString(remote),
                        QuoteString(sha256sums))


@operation()
def pointer(node: str, sha256: str, root: str = "/root/fleet", only_if_absent: bool = False):
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
    yield StringCommand("sh -c", QuoteString(_POINT), "pointer", QuoteString(root),
                        QuoteString(node), QuoteString(sha256))
