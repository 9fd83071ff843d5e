"""PID 1 of a box: build its filesystem view, start sshd and the start hook, reap forever.

Run by the host as `unshare --net --pid --fork --mount --uts --ipc --mount-proc
/usr/bin/python3 -I -S boxinit.py <box dir>`, so it starts inside the box's fresh namespaces but
still sees the host's files. It runs on the box's Python, not the project's, and imports only
built-in modules plus ctypes: every millisecond of interpreter start is paid once per box.
Handshake on stdin/stdout: it prints `up` once its namespaces exist and waits for `go`, which the
host sends after giving it a network. Killing it kills the box (the kernel kills every process
of a PID namespace whose init dies).
"""

from __future__ import annotations

import ctypes
import marshal
import os
import sys
import time

TYPE_CHECKING = False  # typing costs ~10 ms to import; only the type checker needs it
if TYPE_CHECKING:
    from typing import Any

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
PR_SET_NAME = 15
SSHD = "/usr/sbin/sshd"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str = "") -> None:
    rc = _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    _check(rc, f"mount {source} on {target} ({fstype or 'bind'})")


def bind(fd: int, target: str, readonly: bool = False) -> None:
    # Sources are opened before any mount, as /root or /tmp may hide them once mounted over.
    mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
    if readonly:
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def build_filesystem(cfg: dict[str, Any], fds: dict[str, int]) -> None:
    # Overlays first: their layers are named by path, which the mounts below may hide.
    etc = cfg["etc"]
    mount("overlay", "/etc", "overlay", 0,
          f"lowerdir=/etc,upperdir={etc['upper']},workdir={etc['work']}")
    lib = cfg["lib"]  # read-only: the stand-in NVML library over the host's library dir
    mount("overlay", lib["dir"], "overlay", MS_RDONLY, f"lowerdir={lib['layer']}:{lib['dir']}")
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    os.mkdir("/run/sshd", 0o755)  # sshd's privilege separation directory
    os.mkdir("/run/sandbox", 0o755)
    bind(fds[cfg["sys"]], "/run/sandbox", readonly=True)
    for source, target in cfg["binds"]:
        bind(fds[source], target)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    hide = cfg["hide"]  # the other boxes' dirs and keys, when still visible
    if os.path.isdir(hide):
        mount("tmpfs", hide, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=755")


def spawn(argv: list[str], env: dict[str, str], out: int, setsid: bool = False) -> int:
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
    return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=setsid)


def reap_forever(sshd: int) -> None:
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # none now; orphans may be handed to us later
            time.sleep(1)
            continue
        except KeyboardInterrupt:  # `kill -INT 1` from inside: ignored, as by a shell PID 1
            continue
        if pid == sshd:
            os.write(2, f"box-init: sshd exited ({status:#x})\n".encode())


def main() -> None:
    box = sys.argv[1]
    with open(os.path.join(box, "init.marshal"), "rb") as f:
        cfg = marshal.load(f)  # a dict of str, list and None; no json import to pay for
    _libc.prctl(PR_SET_NAME, b"box-init", 0, 0, 0)
    sshd_log = os.open(cfg["sshd_log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sources = [cfg["sys"], *(source for source, _ in cfg["binds"])]
    fds = {s: os.open(s, os.O_PATH | os.O_DIRECTORY) for s in sources}
    os.write(1, b"up\n")
    if sys.stdin.readline().strip() != "go":
        sys.exit("box-init: the host gave no network; stopping")
    os.dup2(2, 1)
    build_filesystem(cfg, fds)
    for fd in fds.values():
        os.close(fd)
    name = cfg["hostname"].encode()
    _check(_libc.sethostname(name, len(name)), "sethostname")
    os.chdir("/root")
    env = dict(os.environ)  # the container's environment, given by the host
    # NOTIFY_SOCKET: sshd says READY=1 there once it listens (sessions do not inherit it)
    sshd = spawn([SSHD, "-D", "-e", "-f", "/run/sandbox/sshd_config"],
                 {**env, "NOTIFY_SOCKET": cfg["notify"]}, sshd_log)
    if cfg["hook"]:
        hook_log = os.open(cfg["hook_log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        spawn(["/bin/bash", cfg["hook"]], env, hook_log, setsid=True)
        os.close(hook_log)
    os.close(sshd_log)
    reap_forever(sshd)


if __name__ == "__main__":
    main()
