"""`sweep`: remove what a crashed run left behind, so `fleet sandbox down` leaves nothing.

A backend that closes cleanly leaves nothing; one whose process died leaves its boxes running
(their processes, netns and veths live as long as their PID 1), the bridge with its addresses,
and the boxes' disks, still mounted. Box processes are found by their command line, which
names `boxinit.py` and the box's dir; the bridge by `network.json`; the disks by the mounts and
loop devices under the state dir. A box's own root lives only in its mount namespace and goes
with its processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

from sandbox.boxes.disks import detach_loops, mounts_under, unmount_path
from sandbox.boxes.layout import IMAGE
from sandbox.boxes.net import delete_link, ip, link_exists


def sweep(state_dir: str | Path, wait: float = 10.0) -> list[str]:
    """Kill leftover boxes under `state_dir`, remove their veths, bridge and disks.

    + state_dir: the `NamespaceBackend` state dir
    + wait: seconds to wait for killed processes to be gone

    Returns one line per thing removed. Example: `sweep(".sandbox/boxes")`.
    """
    state = Path(state_dir).resolve()
    removed: list[str] = []
    deadline = time.monotonic() + wait
    inits = [pid for pid, is_init in box_processes(state).items() if is_init]
    # never our own namespace, whatever a stray command line says
    namespaces = {ns for ns in map(_pid_namespace, inits) if ns} - {_pid_namespace(os.getpid())}
    # Inits first: their `unshare` parents then reap them (and with them the namespaces) and
    # exit. An `unshare` left without a child is killed in the second pass.
    for want_inits in (True, False):
        pids = [pid for pid, is_init in box_processes(state).items() if is_init == want_inits]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                removed.append(f"process {pid}")
            except ProcessLookupError:
                pass
        while any(_exists(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
    # The kernel kills the rest of a box's processes when its init dies, but they take a moment
    # to go on a busy machine: wait for them (killing again any that linger) before returning.
    while (left := _processes_in(namespaces)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    removed += _sweep_network(state)
    removed += _sweep_disks(state)
    if (state / IMAGE).is_dir():
        shutil.rmtree(state / IMAGE, ignore_errors=True)
        removed.append("image layer")
    if state.is_dir():
        for box in sorted(state.iterdir()):
            if (box / "init.marshal").exists() or (box / "box.json").exists():
                shutil.rmtree(box, ignore_errors=True)
                removed.append(f"box dir {box.name}")
    return removed


def _sweep_disks(state: Path) -> list[str]:
    """Unmount the disks under `state` (deepest first) and detach their loop devices."""
    removed = []
    for target in mounts_under(state):
        unmount_path(Path(target))
        removed.append(f"mount {target}")
    return removed + [f"loop device {dev}" for dev in detach_loops(state)]


def box_processes(state: Path) -> dict[int, bool]:
    """Processes of boxes under `state`: pid -> True for a box init, False for its `unshare`."""
    prefix = f"{state}{os.sep}"
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        argv = [a for a in argv if a]
        if len(argv) >= 2 and any(a.endswith("boxinit.py") for a in argv) \
                and argv[-1].startswith(prefix):
            found[int(entry.name)] = os.path.basename(argv[0]) != "unshare"
    return found


def _sweep_network(state: Path, wait: float = 2.0) -> list[str]:
    """Delete the bridge (and its keeper veth) once no box is on it.

    Box veths go with their netns when the boxes die; one still attached after `wait` belongs to
    a sandbox that adopted the bridge since, so the bridge is left to it.
    """
    record = state / "network.json"
    try:
        bridge = json.loads(record.read_text())["bridge"]
    except (OSError, ValueError, KeyError):
        return []
    keeper = f"{bridge}-0"
    deadline = time.monotonic() + wait
    while link_exists(bridge):
        ports = set(re.findall(r"^\d+: ([^:@\s]+)", ip("link show master " + bridge), re.M))
        if ports <= {keeper}:
            delete_link(keeper)
            delete_link(bridge)
            record.unlink()
            return [f"link {bridge}"]
        if time.monotonic() > deadline:
            return [f"kept link {bridge}: another sandbox's boxes are on it"]
        time.sleep(0.05)
    delete_link(keeper)
    record.unlink()
    return []


def _pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _processes_in(namespaces: set[str]) -> list[int]:
    """Live host pids whose pid namespace is one of `namespaces`."""
    if not namespaces:
        return []
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and _pid_namespace(int(e.name)) in namespaces]


def _exists(pid: int) -> bool:
    """Running or not yet reaped: a box init is done only once its parent has waited for it."""
    return Path(f"/proc/{pid}").exists()
