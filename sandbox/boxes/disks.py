"""A box's disks: a filesystem of the rented size, mounted on the operator's machine.

Each disk is a sparse ext4 image on a loop device (`mount -o loop` sets autoclear, so the loop
device goes with the last unmount), or, where this machine has no loop devices, a tmpfs of the
same size. Either way a box that writes past its size gets ENOSPC and nothing else is touched.
The disk stays mounted on the operator's machine while the box exists, stopped or not, so a
stopped box keeps what the provider keeps; `wipe` is what a provider that drops the disk does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sandbox.boxes.errors import BoxError

GIB = 1 << 30


def loop_devices_work() -> bool:
    """Whether this machine can mount an image through a loop device (a container may not)."""
    return os.path.exists("/dev/loop-control") and shutil.which("mkfs.ext4") is not None \
        and shutil.which("losetup") is not None


def size_bytes(size_gb: float) -> int:
    if not size_gb > 0:
        raise BoxError(f"a disk of {size_gb} GB: the size must be positive")
    return max(int(size_gb * GIB), 64 << 20)  # ext4 needs a few MiB for itself


def mount(image: Path, mountpoint: Path, size_gb: float, loop: bool) -> None:
    """Mount the disk at `mountpoint`; a missing image is made (a new, empty disk)."""
    if os.path.ismount(mountpoint):
        return
    mountpoint.mkdir(parents=True, exist_ok=True)
    size = size_bytes(size_gb)
    if not loop:
        _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=700,nosuid,nodev", "tmpfs",
             str(mountpoint))
        return
    if not image.exists():
        tmp = image.with_name(f".{image.name}.new")
        with open(tmp, "wb") as f:
            f.truncate(size)  # sparse: the operator's disk holds only what the box wrote
        # no journal: a sandbox disk never outlives a crash of its host that matters
        _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
             "-E", "lazy_itable_init=1,nodiscard", str(tmp))
        os.replace(tmp, image)
    _run("mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint))


def unmount(image: Path, mountpoint: Path) -> None:
    """Unmount the disk; its loop device goes with it (autoclear). Not mounted is fine."""
    unmount_path(mountpoint)
    detach_loops(image)


def unmount_path(mountpoint: Path) -> None:
    """Unmount what is mounted at `mountpoint`, if anything."""
    if os.path.ismount(mountpoint):
        res = subprocess.run(["umount", str(mountpoint)], capture_output=True, text=True)
        if res.returncode != 0 and os.path.ismount(mountpoint):
            # busy: a box booting now still holds a copy in its mount namespace for a moment
            _run("umount", "--lazy", str(mountpoint))


def wipe(image: Path, mountpoint: Path, size_gb: float, loop: bool) -> None:
    """A new, empty disk in place of the old one."""
    unmount(image, mountpoint)
    image.unlink(missing_ok=True)
    mount(image, mountpoint, size_gb, loop)


def detach_loops(path: Path) -> list[str]:
    """Detach loop devices still backed by `path` or a file under it (autoclear does it once
    unmounted); the devices detached."""
    found = []
    for dev in loops_under(path):
        subprocess.run(["losetup", "-d", dev], capture_output=True)
        found.append(dev)
    return found


def loops_under(path: Path) -> list[str]:
    """Loop devices whose backing file is `path` or lies under it (a deleted one included)."""
    want = str(path)
    found = []
    for entry in sorted(Path("/sys/block").glob("loop*")):
        try:
            backing = (entry / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        backing = backing.removesuffix(" (deleted)")
        if backing == want or backing.startswith(want.rstrip("/") + "/"):
            found.append(f"/dev/{entry.name}")
    return found


def mounts_under(path: Path) -> list[str]:
    """Mount points on this machine at or under `path`, deepest first."""
    prefix = str(path).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = _unescape(line.split()[4])
            if target == str(path) or target.startswith(prefix):
                found.append(target)
    return sorted(set(found), key=lambda t: t.count("/"), reverse=True)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _run(*argv: str) -> None:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise BoxError(f"{' '.join(argv)}: {res.stderr.strip() or res.returncode}")
