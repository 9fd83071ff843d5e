"""PID 1 of a box: build its filesystem view, start sshd and the start hook, reap forever.

Run by the host as `unshare --net --pid --fork --mount --uts --ipc --mount-proc
/usr/bin/python3 -I -S boxinit.py <box dir>`, so it starts inside the box's fresh namespaces but
still sees the host's files, until it pivots into its own root: an overlay of the image layer
and the host's root (both read-only) under the box's disk, so nothing the box writes reaches
the host or another box. It runs on the box's Python, not the project's, and imports only
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

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_MOVE = 8192
MNT_DETACH = 2
PR_SET_NAME, PR_CAPBSET_DROP, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 15, 24, 22, 2
SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "/usr/bin/ssh-keygen"
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key"  # on the box's own disk, as in a real container
STAGED_VOLUME = "/run/.sandbox-volume"
# pivot_root has no libc wrapper on older glibc; its syscall number per architecture
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
# the device nodes a container gets: (name, mode, major, minor)
DEVICES = (("null", 0o666, 1, 3), ("zero", 0o666, 1, 5), ("full", 0o666, 1, 7),
           ("random", 0o666, 1, 8), ("urandom", 0o666, 1, 9), ("tty", 0o666, 5, 0))
# The capabilities a box keeps: a container runtime's default set, without CAP_MKNOD. Without
# CAP_SYS_ADMIN a box cannot unmount what hides the host's files, remount its read-only views
# or mount a disk; without CAP_MKNOD it cannot make a node for one; without CAP_SYS_PTRACE or
# CAP_DAC_READ_SEARCH it cannot reach through another process or a file handle to the host.
# CAP_NET_RAW is not kept either: with it a box could send frames as another box's MAC (the
# bridge would then hand it that box's traffic) or to any address of the host.
KEEP_CAPS = (0, 1, 3, 4, 5, 6, 7, 8, 10, 18, 29, 31)  # CHOWN DAC_OVERRIDE FOWNER FSETID KILL
# SETGID SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT AUDIT_WRITE SETFCAP
CAP_VERSION_3 = 0x20080522
# files of /proc a container gets read-only (kernel settings) or not at all (kernel memory)
PROC_READONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")
PROC_MASKED = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/kmsg")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int = 0, data: str = "") -> None:
    rc = _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                     ctypes.c_ulong(flags), data.encode() if data else None)
    _check(rc, f"mount {source} on {target} ({fstype or 'bind'})")


def bind_path(source: str, target: str, readonly: bool = False) -> None:
    mount(source, target, None, MS_BIND)
    if readonly:
        mount("none", target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def bind(fd: int, target: str, readonly: bool = False) -> None:
    # Sources are opened before any mount, as the mounts may hide them.
    bind_path(f"/proc/self/fd/{fd}", target, readonly)


def pivot_into(new_root: str) -> None:
    """Make `new_root` the box's `/` and drop the host's root from this mount namespace."""
    os.chdir(new_root)
    number = SYS_PIVOT_ROOT[os.uname().machine]
    # pivot_root(".", "."): the old root is stacked under the new one, then detached
    _check(_libc.syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "unmount the host's root")
    os.chdir("/")


def make_dev() -> None:
    """A container's /dev: a tmpfs with the usual nodes, its own ptys and shared memory."""
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=755,size=64k")
    old = os.umask(0)
    try:
        for name, mode, major, minor in DEVICES:
            os.mknod(f"/dev/{name}", mode | 0o020000, os.makedev(major, minor))  # S_IFCHR
        os.mkdir("/dev/pts", 0o755)
        os.mkdir("/dev/shm", 0o1777)
    finally:
        os.umask(old)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=620")
    os.symlink("pts/ptmx", "/dev/ptmx")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"/dev/{name}")
    os.symlink("/proc/self/fd", "/dev/fd")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")


def build_filesystem(cfg: dict[str, Any], fds: dict[str, int]) -> None:
    """The box's own root: the image and the host's root, read-only, under the box's disk.

    Whatever the box writes lands on its disk (the overlay's upper layer); the host's root is
    only ever read. Mounts that need a source on the host are made before the pivot.
    """
    root = cfg["rootfs"]
    layers = cfg["layers"]
    mount("overlay", root, "overlay", 0,
          f"lowerdir={layers['image']}:/,upperdir={layers['upper']},workdir={layers['work']}")
    mount("tmpfs", f"{root}/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    for path in cfg["run_dirs"]:  # sshd's privilege separation directory (sandbox/boxes/sshd.py)
        os.mkdir(f"{root}{path}", 0o755)
    os.mkdir(f"{root}/run/sandbox", 0o755)
    bind(fds[cfg["sys"]], f"{root}/run/sandbox", readonly=True)
    volume = cfg["volume"]
    if volume:  # staged on the fresh /run: no path of the box's is resolved on the host
        os.mkdir(f"{root}{STAGED_VOLUME}", 0o700)
        bind(fds[volume["source"]], f"{root}{STAGED_VOLUME}")
    pivot_into(root)
    # from here on every path resolves inside the box's own root, its symlinks included
    if volume:  # RunPod's pod volume at its mount path
        os.makedirs(volume["path"], exist_ok=True)
        mount(STAGED_VOLUME, volume["path"], None, MS_MOVE)
        os.rmdir(STAGED_VOLUME)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for path in PROC_READONLY:
        if os.path.exists(path):
            bind_path(path, path, readonly=True)
    mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    make_dev()
    for path in PROC_MASKED:
        if os.path.exists(path):
            bind_path("/dev/null", path, readonly=True)
    for path in cfg["hide"]:  # the operator's files the host's root still shows
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=755")
    try:
        bind_runtime_files()
    except OSError as e:  # a box that broke its own /etc boots broken, as a real one would
        os.write(2, f"box-init: {e}\n".encode())


def bind_runtime_files() -> None:
    """What the container runtime writes for the box, read-only from its sys dir, over the
    box's own /etc/hostname and /etc/hosts; and the stand-in NVML's config link."""
    for name in ("hostname", "hosts"):
        target = f"/etc/{name}"
        if not os.path.isfile(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
        bind_path(f"/run/sandbox/{name}", target, readonly=True)
    link = "/etc/sandbox-nvml.json"
    if not os.path.islink(link) or os.readlink(link) != "/run/sandbox/nvml.json":
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink("/run/sandbox/nvml.json", link)


def drop_capabilities() -> None:
    """Keep only KEEP_CAPS, in this init and everything it starts (the bounding set)."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if cap not in KEEP_CAPS:
            _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
    keep = sum(1 << cap for cap in KEEP_CAPS)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    # two 32-bit halves of (effective, permitted, inheritable); every cap kept is below 32
    data = (ctypes.c_uint32 * 6)(keep, keep, 0, 0, 0, 0)
    _check(_libc.capset(header, data), "capset")


# Syscalls a box may not make, as a container runtime's default seccomp profile: the kernel
# keyrings (not namespaced: root's user keyring is the host's and every box's) and new user
# namespaces (in one, root regains capabilities over what it mounts). Per architecture:
# (audit arch, {name: number}); x86_64's x32 numbers and any foreign arch are refused whole.
SECCOMP_ARCH = {
    "x86_64": (0xC000003E, {"add_key": 248, "request_key": 249, "keyctl": 250,
                            "unshare": 272, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {"add_key": 217, "request_key": 218, "keyctl": 219,
                             "unshare": 97, "clone": 220, "clone3": 435}),
}
CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38


def seccomp_program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions of classic BPF over `seccomp_data`."""
    arch, nr = SECCOMP_ARCH[machine]
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | EPERM, 0x00050000 | ENOSYS
    # (code, k, label if true, label if false); labels resolve to relative jumps below
    prog: list[tuple[int | str, int, str | None, str | None]] = [
        (ld, 4, None, None), (jeq, arch, None, "enosys"), (ld, 0, None, None)]
    if machine == "x86_64":
        prog.append((jge, 0x40000000, "enosys", None))  # the x32 ABI
    prog += [(jeq, nr[name], "eperm", None) for name in ("add_key", "request_key", "keyctl")]
    prog += [(jeq, nr["clone3"], "enosys", None),  # flags behind a pointer: libc falls back
             (jeq, nr["unshare"], "flags", None), (jeq, nr["clone"], "flags", None),
             (ret, allow, None, None),
             ("flags", 16, None, None), (jset, CLONE_NEWUSER, "eperm", None),  # args[0], low
             (ret, allow, None, None), ("eperm", eperm, None, None), ("enosys", enosys, None, None)]
    labels: dict[str, int] = {code: i for i, (code, _, _, _) in enumerate(prog)
                              if isinstance(code, str)}
    out = []
    for i, (code, k, jt, jf) in enumerate(prog):
        if isinstance(code, str):  # a label: "flags" loads, the others return
            code = ld if code == "flags" else ret
        out.append((code, labels[jt] - i - 1 if jt else 0, labels[jf] - i - 1 if jf else 0, k))
    return out


def install_seccomp() -> None:
    """Load the filter into this init; everything it starts inherits it, for good."""
    prog = seccomp_program(os.uname().machine)

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*(SockFilter(*ins) for ins in prog))
    fprog = SockFprog(len(prog), filters)
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0),
           "seccomp")


def spawn(argv: list[str], env: dict[str, str], out: int, setsid: bool = False) -> int:
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)]
    return os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=setsid)


def reap_forever(sshd: int, notify: str) -> None:
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
            tell_host(notify, f"SANDBOX_SSHD_EXITED={status:#x}")


def tell_host(notify: str, message: str) -> None:
    """One datagram on the socket the host waits on while the box boots (sandbox/boxes/proc.py):
    a box whose sshd died fails its start at once, not at the deadline. Nobody listening (the
    box booted long ago) is fine."""
    import socket  # only when sshd exits: boots never pay for the import

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(message.encode(), notify)
    except OSError:
        pass


def main() -> None:
    # argv: the write end of the pipe the host relays into sshd's log, then the box's dir.
    # No file of the host is ever handed to the box: a process could reopen it through /proc.
    sshd_log, box = int(sys.argv[1]), sys.argv[2]
    with open(os.path.join(box, "init.marshal"), "rb") as f:
        cfg = marshal.load(f)  # a dict of str, list and None; no json import to pay for
    _libc.prctl(PR_SET_NAME, b"box-init", 0, 0, 0)
    sources = [cfg["sys"], *([cfg["volume"]["source"]] if cfg["volume"] else [])]
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
    install_seccomp()
    drop_capabilities()  # last: nothing of the box may undo what the init set up
    os.chdir("/root")
    env = dict(os.environ)  # the container's environment, given by the host
    if cfg["sshd_go"]:  # RunPod: the image's start step makes the host keys, then asks for sshd
        os.mkfifo(cfg["sshd_go"], 0o600)
        start_hook(cfg, env)
        with open(cfg["sshd_go"], "rb") as go:  # blocks until the start step opens it
            go.read(1)
        os.unlink(cfg["sshd_go"])
    else:  # Vast: its runtime's sshd, on the host key the disk keeps, before the onstart
        if not os.path.exists(HOST_KEY):
            make_host_key(cfg["hostname"])
    tell_host(cfg["notify"], f"SANDBOX_HOST_KEY={served_key()}")
    # NOTIFY_SOCKET: sshd says READY=1 there once it listens (sessions do not inherit it)
    sshd = spawn([SSHD, "-D", "-e", "-f", "/run/sandbox/sshd_config"],
                 {**env, "NOTIFY_SOCKET": cfg["notify"]}, sshd_log)
    if not cfg["sshd_go"]:
        start_hook(cfg, env)
    os.close(sshd_log)
    reap_forever(sshd, cfg["notify"])


def start_hook(cfg: dict[str, Any], env: dict[str, str]) -> None:
    """The start command (Vast's onstart, RunPod's dockerArgs or the image's own), in its
    own session, logging where the provider's runtime does."""
    if cfg["hook"]:
        hook_log = os.open(cfg["hook_log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        spawn(["/bin/bash", cfg["hook"]], env, hook_log, setsid=True)
        os.close(hook_log)


def make_host_key(hostname: str) -> None:
    """A new ed25519 host key in /etc/ssh, as an image's start makes one where none is."""
    os.makedirs(os.path.dirname(HOST_KEY), exist_ok=True)
    pid = spawn([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", f"root@{hostname}",
                 "-f", HOST_KEY], {}, 2)
    os.waitpid(pid, 0)


def served_key() -> str:
    """The public half of the host key sshd is about to load ("ssh-ed25519 AAAA..."), read
    from its private key (a .pub beside it may say anything); "" when there is none."""
    r, w = os.pipe()
    try:
        pid = spawn([SSH_KEYGEN, "-y", "-f", HOST_KEY], {}, w)
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read(4096).decode(errors="replace")
    os.waitpid(pid, 0)
    return " ".join(out.split()[:2]) if out.startswith("ssh-ed25519 ") else ""


if __name__ == "__main__":
    main()
