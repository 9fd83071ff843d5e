"""What the operator's machine needs before it can host boxes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sandbox.boxes.errors import BoxError

# Debian packages the boxes use: sshd and its keygen, `ip`, `unshare`/`nsenter`, `mount` and
# `losetup` with `mkfs.ext4` for the boxes' disks (a tmpfs stands in without them), the boxes'
# own Python (a pyenv Python under /root is hidden inside a box), bash for start hooks, `ps`.
DEBIAN_PACKAGES = (
    "openssh-server",
    "iproute2",
    "util-linux",
    "mount",
    "e2fsprogs",
    "python3",
    "python3-venv",
    "bash",
    "procps",
)

SSHD = "/usr/sbin/sshd"
BOX_PYTHON = "/usr/bin/python3"
BASH = "/bin/bash"
_TOOLS = {
    SSHD: "openssh-server",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "losetup": "mount",
    BOX_PYTHON: "python3",
    BASH: "bash",
}


def preflight() -> None:
    """Raise `BoxError` naming what is missing: root, or the tools the boxes run."""
    if os.geteuid() != 0:
        raise BoxError("sandbox boxes need root (namespaces, veth, mounts)")
    missing = sorted({pkg for tool, pkg in _TOOLS.items() if not _found(tool)})
    if missing:
        raise BoxError(f"sandbox boxes need Debian packages: apt-get install {' '.join(missing)}")


def _found(tool: str) -> bool:
    return os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool) is not None


# where a box writing onto the operator's machine would show first (a shared root did: the
# RunPod deploys' /post_start.sh landed in the host's /)
WATCHED_DIRS = ("/opt", "/usr/local", "/usr/local/bin")


def host_snapshot(dirs: tuple[str, ...] = WATCHED_DIRS) -> dict[str, tuple[int, int]]:
    """What boxes must never change on this machine: (size, mtime) of every entry of `dirs`,
    one level deep, and of `/` its names and files (its directories change by the machine's
    own work: /tmp, /root, ...). Equal before and after means no box wrote there."""
    found = {}
    for d in ("/", *dirs):
        for entry in Path(d).iterdir():
            st = entry.lstat()
            found[str(entry)] = (0, 0) if d == "/" and entry.is_dir() else (
                st.st_size, st.st_mtime_ns)
    return found


def snapshot_changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
                     ) -> list[str]:
    """The paths whose entry differs between two snapshots, sorted."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
