"""`NamespaceBackend`: every running sandbox instance is a real SSH host on this machine.

A box is a process tree in its own network, PID, mount, UTS and IPC namespaces: `boxinit`
as PID 1, OpenSSH's sshd under it. Its root is its own: an overlay of the image layer and the
host's root, read-only, under the box's disk (`disks`: a filesystem of the rented size). Its
netns hangs off one bridge; its ports are forwarded from the machine's public address by
`forward.Forwarder`. Stopping a box is one SIGKILL to its PID 1: the kernel kills the rest of
the namespace before the init can be reaped.
"""

from __future__ import annotations

import dataclasses
import marshal
import os
import platform
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

from sandbox.backend import BoxEndpoints, BoxSpec, GpuSpec
from sandbox.boxes import config, disks, layout, sshd
from sandbox.boxes.errors import BoxError
from sandbox.boxes.forward import Forwarder, Mapping, PortAllocator, bind
from sandbox.boxes.host import BOX_PYTHON, preflight
from sandbox.boxes.layout import BoxPaths, write_atomic, write_json
from sandbox.boxes.net import Network
from sandbox.boxes.proc import (
    SSHD_EXITED,
    children,
    comm,
    descendants,
    kill_pid,
    listening,
    notified,
    notify_socket,
    oldest_child,
    only_child,
    read_line,
    relay_log,
    start_time,
    tail,
)

BOXINIT = Path(__file__).with_name("boxinit.py")
NVML_LIB = "libnvidia-ml.so.1"
# What RunPod's images run at container start (their CMD): make the SSH host keys where /etc/ssh
# has none (a new container disk has none), start sshd, run /post_start.sh if present, stay.
# sshd is the box init's child here: the start step asks the init for it through SSHD_GO.
SSHD_GO = "/run/sandbox-sshd-go"
IMAGE_START_SH = f"""#!/bin/bash
# the sandbox image's /start.sh, as RunPod's: new host keys where /etc/ssh has none, then sshd
[ -f /etc/ssh/ssh_host_ed25519_key ] ||
    ssh-keygen -q -t ed25519 -N '' -C "root@$(hostname)" -f /etc/ssh/ssh_host_ed25519_key
[ -p {SSHD_GO} ] && echo go > {SSHD_GO}
[ -x /post_start.sh ] && /post_start.sh
exec sleep infinity
"""
IMAGE_START = "exec /start.sh"  # a pod whose dockerArgs leave the image's command alone
# Directories of the host's root a box must not see: the box gets them empty, on its disk
OWN_DIRS = {"root": 0o700, "tmp": 0o1777, "var/tmp": 0o1777, "var/log": 0o755, "home": 0o755}
HOST_KEY_SAID = b"SANDBOX_HOST_KEY="  # the init's word on the key its sshd serves
NOTIFY = "notify.sock"  # in sys/: where the box's sshd reports READY=1
_NAMESPACES = ["--net", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc",
               "--propagation", "private", "--mount-proc"]


@dataclasses.dataclass(eq=False)
class _Box:
    spec: BoxSpec
    paths: BoxPaths
    index: int
    address: str
    ports: dict[int, int] = dataclasses.field(default_factory=dict)  # internal -> public
    mappings: list[Mapping] = dataclasses.field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None  # the `unshare` parent of the box's PID 1
    pid: int | None = None  # the box's PID 1, as this machine numbers it
    host_key: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # the container's
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    relays: list[threading.Thread] = dataclasses.field(default_factory=list)  # its logs


class NamespaceBackend:
    """Boxes as namespaced SSH hosts; see the module docstring and docs/sandbox.md "Boxes".

    + state_dir: where boxes keep their disks, keys and logs (e.g. `.sandbox/boxes`)
    + bridge: the host bridge the boxes hang off (removed by `close`)
    + subnet: its lower half holds the gateway and the machines' public addresses, its upper
      half the boxes' own addresses
    + ready_timeout: seconds a box may take to boot before `start` gives up
    """

    def __init__(self, state_dir: str | Path, *, bridge: str = "fleetbr0",
                 subnet: str = "10.77.0.0/16", ready_timeout: float = 30.0) -> None:
        preflight()
        self.state_dir = layout.check_state_dir(Path(state_dir))
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.net = Network(bridge, subnet)
        self.ready_timeout = ready_timeout
        self._unshare = shutil.which("unshare") or "unshare"  # not looked up on the box's PATH
        self._loop = disks.loop_devices_work()  # else each disk is a tmpfs of its size
        # the operator's files the host's root shows: this state and the project that runs it
        self._hidden = sorted({str(self.state_dir), str(self.state_dir.parent),
                               *_checkout()})
        self._lock = threading.Lock()  # the box table and the network
        self._boxes: dict[str, _Box] = {}
        self._closed = False
        self._ports = PortAllocator()
        self.net.up()  # refuses a network another sandbox uses before touching anything
        try:
            self._images = self._build_images()
        except BaseException:
            self.net.down()
            raise
        # for sweep; written only now, so a refused backend can never sweep another's bridge
        write_json(self.state_dir / "network.json", {"bridge": bridge, "subnet": subnet})
        self._forwarder = Forwarder()

    # --- the BoxBackend protocol ---------------------------------------------------------

    def start(self, spec: BoxSpec) -> BoxEndpoints:
        """Boot a box for `spec`; return once its sshd answers.

        A box that was killed (a stopped instance) boots again on the disk it had, as a
        resumed instance does; any other box id gets a fresh disk.
        """
        paths = BoxPaths.of(self.state_dir, spec.box_id)
        if 22 not in spec.tcp_ports:
            raise BoxError(f"box {spec.box_id}: tcp_ports must include 22")
        config.check_volume(spec)
        with self._lock:
            if self._closed:
                raise BoxError("the box backend is closed")
            self.net.add_public(spec.public_ip)
            box = self._boxes.get(spec.box_id)
            fresh = box is None
            if box is None:
                used = {b.index for b in self._boxes.values()}
                index = next(i for i in range(1, len(used) + 2) if i not in used)
                box = _Box(dataclasses.replace(spec), paths, index,
                           str(self.net.box_address(index)))
                self._boxes[spec.box_id] = box
        with box.lock:
            if not fresh and box.pid is not None:
                raise BoxError(f"box {spec.box_id} is already running")
            try:
                if fresh:
                    self._remove_disks(paths)  # a new rental, new disks
                    shutil.rmtree(paths.root, ignore_errors=True)
                else:
                    self._resume(box, spec)
                self._open_ports(box)
                self._launch(box)
            except BaseException:
                self._stop(box)
                self._close_ports(box)
                if fresh:
                    self._forget(box)
                raise
            return self._endpoints(box)

    def destroy(self, box_id: str) -> None:
        """Kill every process of the box and delete its disk; an unknown box is fine."""
        with self._lock:
            box = self._boxes.get(box_id)
        if box is not None:
            self._remove(box)

    def kill(self, box_id: str) -> None:
        """Host death: the box and its public ports vanish at once; its disk stays.

        An unknown box is fine: its start may have failed before the fault arrived.
        """
        with self._lock:
            box = self._boxes.get(box_id)
        if box is None:
            return
        with box.lock:
            self._stop(box)
            self._close_ports(box)

    def restart(self, box_id: str) -> BoxEndpoints:
        """Container restart: every process dies, init, sshd and hook rerun; the disk stays
        where the provider keeps it (`BoxSpec.disk_kept`), and the volume always. A new
        container disk has no host key: the endpoints carry the one sshd serves now."""
        box = self._get(box_id)
        with box.lock:
            self._stop(box)
            self._open_ports(box)
            self._launch(box)
            return self._endpoints(box)

    def set_gpu(self, box_id: str, gpu: GpuSpec) -> None:
        """Driver drift: the box's NVML (AMD SMI on an AMD box) reports `gpu` from its next
        init on. The vendor is the box's own: its image holds one vendor's library."""
        box = self._get(box_id)
        if gpu.vendor != box.spec.gpu.vendor:
            raise BoxError(f"box {box_id}: a {box.spec.gpu.vendor} box cannot turn {gpu.vendor}")
        with box.lock:
            box.spec.gpu = gpu
            self._write_gpu_config(box)

    def set_sshd_hung(self, box_id: str, hung: bool) -> None:
        """sshd_hang: from now on the box's sshd logs each new session in and never runs its
        command; sessions already open, and the box's other processes, run on. False heals.

        A hung login (stuck storage under the home, a stuck PAM) hangs a session opened over
        a connection made before it too (an operator's master connection), but sshd reads the
        hang's config only for new connections: the connections with no session open are
        ended, so that the next session logs in hung."""
        box = self._get(box_id)
        with box.lock:
            box.spec.sshd_hung = hung
            if box.pid is not None:
                self._write_sshd_config(box)
                self._reload_sshd(box)
                if hung:
                    self._end_idle_connections(box)

    def _end_idle_connections(self, box: _Box) -> None:
        assert box.pid is not None
        listener = oldest_child(box.pid, "sshd")
        if listener is None:
            return
        for conn in children(listener):
            below = descendants(conn)
            if all(comm(p) in ("sshd", None) for p in below):  # no command runs on it
                for pid in (conn, *below):
                    kill_pid(pid)

    def set_ssh_cut(self, box_id: str, cut: bool) -> None:
        """ssh_path_cut: the box's public SSH port drops every connection, its live ones too,
        as a provider's SSH proxy that is down; its other ports and the box run on."""
        box = self._get(box_id)
        with box.lock:
            box.spec.ssh_cut = cut
            for mapping in box.mappings:
                if mapping.target[1] == 22:
                    self._forwarder.set_cut(mapping, cut)

    def close(self) -> None:
        """Destroy every box, stop forwarding and remove the bridge with its addresses."""
        with self._lock:
            self._closed = True
            boxes = list(self._boxes.values())
        for box in boxes:  # kill all first: the kernel tears the namespaces down in parallel
            self.net.detach(box.index)
            if box.pid is not None:
                kill_pid(box.pid)
        for box in boxes:
            self._remove(box)
        self._forwarder.close()
        self.net.down()
        (self.state_dir / "network.json").unlink(missing_ok=True)
        for name in layout.IMAGES.values():
            shutil.rmtree(self.state_dir / name, ignore_errors=True)

    # --- for tests and diagnostics ------------------------------------------------------------

    def init_pid(self, box_id: str) -> int | None:
        """The box's PID 1 as this machine numbers it; None while it is down."""
        return self._get(box_id).pid

    def address(self, box_id: str) -> str:
        """The box's own address on the bridge (its eth0)."""
        return self._get(box_id).address

    # --- internals ------------------------------------------------------------------------

    def _get(self, box_id: str) -> _Box:
        with self._lock:
            box = self._boxes.get(box_id)
        if box is None:
            raise BoxError(f"no box {box_id} in this sandbox")
        return box

    def _endpoints(self, box: _Box) -> BoxEndpoints:
        ip = box.spec.public_ip
        return BoxEndpoints(ip, box.ports[22], ip, dict(box.ports), box.host_key)

    def _resume(self, box: _Box, spec: BoxSpec) -> None:
        """A killed box boots again: same disk and host key, the spec it is given now."""
        if spec.public_ip != box.spec.public_ip or set(spec.tcp_ports) != set(box.ports):
            self._close_ports(box)
            box.ports.clear()
        box.spec = dataclasses.replace(spec)

    def _open_ports(self, box: _Box) -> None:
        """Map each internal port to a public one; a restarted box gets its old ports back."""
        if box.mappings:
            return
        ip = box.spec.public_ip
        for inner in dict.fromkeys(box.spec.tcp_ports):
            if inner in box.ports:
                try:
                    sock = bind(ip, box.ports[inner])
                except OSError as e:
                    raise BoxError(f"box {box.spec.box_id}: {ip}:{box.ports[inner]}: {e}") from e
            else:
                box.ports[inner], sock = self._ports.take(ip)
            cut = box.spec.ssh_cut and inner == 22
            box.mappings.append(self._forwarder.open(sock, (box.address, inner), cut))

    def _close_ports(self, box: _Box) -> None:
        for mapping in box.mappings:
            self._forwarder.close_mapping(mapping)
        box.mappings.clear()

    def _launch(self, box: _Box) -> None:
        self._mount_disks(box)
        self._prepare(box)
        paths = box.paths
        with notify_socket(paths.sys / NOTIFY) as notify:
            self._boot(box, notify)

    def _boot(self, box: _Box, notify: socket.socket) -> None:
        paths = box.paths
        # the box writes its logs into pipes, relayed into files here up to LOG_CAP: a file of
        # the host handed to the box could be reopened through /proc and filled without end
        init_log, sshd_log = relay_log(paths.log / "init.log"), relay_log(paths.log / "sshd.log")
        box.relays = [init_log.thread, sshd_log.thread]  # sshd's last: _wait_ready joins it
        try:
            argv = [self._unshare, *_NAMESPACES, BOX_PYTHON, "-I", "-S", str(BOXINIT)]
            box.proc = subprocess.Popen(
                [*argv, str(sshd_log.fd), str(paths.root)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=init_log.fd,
                pass_fds=(sshd_log.fd,),
                env=box.env,  # PID 1's environment is the container's, as /proc/1/environ shows
            )
        finally:
            os.close(init_log.fd)
            os.close(sshd_log.fd)
        proc = box.proc
        assert proc.stdin is not None and proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout
        with proc.stdin, proc.stdout:
            if read_line(proc.stdout, deadline) != "up":
                raise self._boot_error(box, "its init did not come up")
            box.pid = only_child(proc.pid)
            if box.pid is None:
                raise self._boot_error(box, "its init has no process")
            self._record(box)
            self.net.attach(box.index, box.pid, box.address)
            proc.stdin.write(b"go\n")
        self._wait_ready(box, notify, deadline)

    def _prepare(self, box: _Box) -> None:
        """Write what the box is made of. Its host key is the box's own, in /etc/ssh on its
        disk: the init (Vast) or the image's start step (RunPod) makes one where none is."""
        spec, paths = box.spec, box.paths
        paths.make()
        box.host_key = None  # until the init says which key its sshd serves
        runpod = spec.provider == "runpod"
        hook_text = spec.start_hook or (IMAGE_START if runpod else None)
        box.env = config.box_env(spec, box.ports)
        self._write_sshd_config(box)
        write_atomic(paths.sys / "authorized_keys", spec.authorized_keys.strip() + "\n", 0o600)
        self._write_gpu_config(box)
        hook = paths.sys / "start-hook.sh"
        if hook_text:
            write_atomic(hook, hook_text.rstrip("\n") + "\n", 0o755)
        else:
            hook.unlink(missing_ok=True)
        # Like a container runtime, the host writes hostname and hosts at every start, into the
        # sys dir (never into the box's disk, where a symlink of the box's could lead it out);
        # the init binds them over the box's own.
        write_atomic(paths.sys / "hostname", spec.hostname + "\n")
        write_atomic(paths.sys / "hosts", config.hosts_file(spec.hostname, box.address))
        volume = None
        if spec.volume_path:
            volume = {"source": str(paths.volume / "data"), "path": spec.volume_path}
        _write_marshal(paths.init_config, {
            "hostname": spec.hostname,
            "sys": str(paths.sys),
            "rootfs": str(paths.rootfs),
            "layers": {"image": str(paths.layer), "upper": str(paths.upper),
                       "work": str(paths.work)},
            "volume": volume,
            "hide": self._hidden,
            "run_dirs": list(sshd.RUN_DIRS),
            "hook": f"{config.SANDBOX_DIR}/start-hook.sh" if hook_text else None,
            "sshd_go": SSHD_GO if runpod else None,
            "hook_log": config.HOOK_LOG,
            "notify": f"{config.SANDBOX_DIR}/{NOTIFY}",
        })

    def _write_sshd_config(self, box: _Box) -> None:
        text = config.sshd_config(box.env, hung=box.spec.sshd_hung)
        write_atomic(box.paths.sys / "sshd_config", text)

    def _reload_sshd(self, box: _Box) -> None:
        """SIGHUP the box's sshd, which re-executes itself on its config, and wait until it
        listens again (it says READY=1 on $NOTIFY_SOCKET, as at boot)."""
        assert box.pid is not None
        pid = oldest_child(box.pid, "sshd")  # the init starts sshd before anything else
        if pid is None:
            raise BoxError(f"box {box.spec.box_id}: its sshd is not running")
        deadline = time.monotonic() + self.ready_timeout
        with notify_socket(box.paths.sys / NOTIFY) as notify:
            os.kill(pid, signal.SIGHUP)
            while time.monotonic() < deadline:
                said = notified(notify, max(0.0, deadline - time.monotonic()))
                if b"READY=1" in said:
                    return
                if SSHD_EXITED in said:
                    break
        logs = tail(box.paths.log / "sshd.log")
        raise BoxError(f"box {box.spec.box_id}: its sshd did not restart\n{logs}".rstrip())

    def _mount_disks(self, box: _Box) -> None:
        """The box's disk (new where the provider drops it at each start) and its volume."""
        spec, paths = box.spec, box.paths
        paths.make()
        if spec.disk_kept:
            disks.mount(paths.disk_image, paths.disk, spec.disk_gb, self._loop)
        else:
            disks.wipe(paths.disk_image, paths.disk, spec.disk_gb, self._loop)
        for path in (paths.upper, paths.work, paths.layer):  # never follow a link on a disk
            if path.is_symlink():
                raise BoxError(f"box {spec.box_id}: {path} is a symbolic link")
        _init_disk(paths)
        # the image layer goes on the box's disk: a layer under the host's root would overlap it
        image = paths.layer
        shutil.rmtree(image, ignore_errors=True)
        if spec.gpu.vendor not in self._images:
            raise BoxError(f"box {spec.box_id}: no image for GPU vendor {spec.gpu.vendor!r}")
        shutil.copytree(self._images[spec.gpu.vendor], image, symlinks=True)
        for rel in _masked_host_files():  # whiteouts: the host's secrets are not the image's
            (image / rel).parent.mkdir(parents=True, exist_ok=True)
            os.mknod(image / rel, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        if spec.volume_path:
            disks.mount(paths.volume_image, paths.volume, spec.volume_gb, self._loop)
            (paths.volume / "data").mkdir(exist_ok=True)

    def _remove_disks(self, paths: BoxPaths) -> None:
        disks.unmount(paths.volume_image, paths.volume)
        disks.unmount(paths.disk_image, paths.disk)

    def _write_gpu_config(self, box: _Box) -> None:
        """The world the box's stand-in GPU library reports: NVML's or AMD SMI's."""
        from sandbox import amdsmi, nvml

        # atomic rename: the box reads it through a bind of the directory, so renames show
        if box.spec.gpu.vendor == "amd":
            amdsmi.write_config(box.paths.amdsmi_config, box.spec.gpu)
        else:
            nvml.write_config(box.paths.nvml_config, box.spec.gpu)

    def _record(self, box: _Box) -> None:
        """What `cleanup.sweep` needs if this process dies without closing the backend."""
        assert box.pid is not None
        write_json(box.paths.record, {
            "box_id": box.spec.box_id, "pid": box.pid, "pid_start": start_time(box.pid),
            "veth": self.net.veth(box.index), "address": box.address, "ports": box.ports,
        })

    def _wait_ready(self, box: _Box, notify: socket.socket, deadline: float) -> None:
        """Until sshd listens on port 22 in the box's netns.

        Debian's sshd says READY=1 on $NOTIFY_SOCKET once it listens; the kernel's socket
        table is the fallback. No probe connection: each would cost the box an sshd fork and
        re-exec, which adds up when many boot at once.
        """
        assert box.proc is not None
        table = Path(f"/proc/{box.pid}/net/tcp")
        while time.monotonic() < deadline:
            said = notified(notify, 0.05)
            if said.startswith(HOST_KEY_SAID):
                box.host_key = said[len(HOST_KEY_SAID):].decode(errors="replace") or None
                continue
            if b"READY=1" in said:
                return
            if SSHD_EXITED in said:  # the init lives on: waiting would only wait out the deadline
                box.relays[-1].join(timeout=2)  # sshd's log, its pipe now closed
                raise self._boot_error(box, "its sshd exited before it listened")
            if box.proc.poll() is not None:
                raise self._boot_error(box, "it exited while booting")
            try:
                if listening(table.read_text(), 22):
                    return
            except OSError:
                pass
        raise self._boot_error(box, f"sshd did not listen within {self.ready_timeout:g}s")

    def _boot_error(self, box: _Box, why: str) -> BoxError:
        if box.proc is not None and box.proc.poll() is not None:
            for relay in box.relays:  # what the init wrote before it died
                relay.join(timeout=2)
        logs = "".join(tail(box.paths.log / name) for name in ("init.log", "sshd.log"))
        return BoxError(f"box {box.spec.box_id} failed to start: {why}\n{logs}".rstrip())

    def _stop(self, box: _Box) -> None:
        """Kill the box's processes and wait until every one is gone."""
        self.net.detach(box.index)
        pid = box.pid
        if pid is None and box.proc is not None and box.proc.poll() is None:
            pid = only_child(box.proc.pid)
        if pid is not None:
            kill_pid(pid)
        elif box.proc is not None:
            box.proc.kill()  # not forked yet: --kill-child takes the init along
        if box.proc is not None:
            # unshare reaps PID 1 only after the kernel has reaped the rest of its namespace
            box.proc.wait()
        box.pid = box.proc = None

    def _remove(self, box: _Box) -> None:
        with box.lock:
            self._stop(box)
            self._close_ports(box)
            self._forget(box)

    def _forget(self, box: _Box) -> None:
        """Delete a stopped box's disks and take it out of the table."""
        self._remove_disks(box.paths)
        shutil.rmtree(box.paths.root, ignore_errors=True)
        with self._lock:
            if self._boxes.get(box.spec.box_id) is box:
                del self._boxes[box.spec.box_id]

    def _build_images(self) -> dict[str, Path]:
        """The image layers a box sees over the host's root, one per GPU vendor (each box's
        disk gets a copy of its vendor's): the RunPod image's /start.sh, and the stand-in
        vendor library where the real one lives. NVIDIA: libnvidia-ml.so.1 in the system
        library dir. AMD: libamd_smi.so and librocm-core.so in /opt/rocm/lib, where a ROCm
        image has them and the amdsmi binding looks, and no NVML (so NVML refuses, as on a
        real AMD box)."""
        from sandbox import amdsmi, nvml

        images = {}
        for vendor, name in layout.IMAGES.items():
            image = self.state_dir / name
            (image / "etc").mkdir(parents=True, exist_ok=True)
            write_atomic(image / "start.sh", IMAGE_START_SH, 0o755)
            for account in ("shadow", "gshadow"):  # the host's accounts, without passwords
                write_atomic(image / "etc" / account, _locked(Path("/etc") / account), 0o640)
            images[vendor] = image
        nvml_lib = nvml.build_library(self.state_dir / "nvml-build")
        _install(nvml_lib, images["nvidia"] / _library_dir().lstrip("/") / NVML_LIB)
        for lib in amdsmi.build_libraries(self.state_dir / "amdsmi-build"):
            _install(lib, images["amd"] / amdsmi.ROCM_LIB_DIR / lib.name)
        return images


def _install(built: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(built, tmp)
    tmp.chmod(0o755)
    os.replace(tmp, dest)


def _checkout() -> list[str]:
    """The project's checkout, when this code runs from one (not from an installed package,
    whose folder may be one the box's own Python needs)."""
    top = Path(__file__).resolve().parents[2]
    return [str(top)] if (top / "pyproject.toml").exists() else []


def _masked_host_files() -> list[str]:
    """The host's own secrets under its /etc (relative paths), hidden from every box."""
    return sorted(str(p.relative_to("/")) for p in Path("/etc/ssh").glob("ssh_host_*")
                  if p.is_file() and not p.is_symlink()) + [
        name for name in ("etc/shadow-", "etc/gshadow-") if os.path.isfile(f"/{name}")]


def _locked(path: Path) -> str:
    """An /etc/shadow-style file with every password field replaced by `*` (no password)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ""
    out = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > 1:
            fields[1] = "*"
        out.append(":".join(fields))
    return "\n".join(out) + "\n" if out else ""


def _init_disk(paths: BoxPaths) -> None:
    """The root's layers on a disk; on a new disk, the directories the box owns outright
    (opaque: the host's /root, /tmp and logs stay out of sight)."""
    paths.work.mkdir(exist_ok=True)
    if paths.upper.exists():
        return
    tmp = paths.disk / ".upper.new"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for rel, mode in OWN_DIRS.items():
        d = tmp / rel
        d.mkdir(parents=True)
        d.chmod(mode)
        os.setxattr(d, "trusted.overlay.opaque", b"y")
    os.replace(tmp, paths.upper)


def _write_marshal(path: Path, data: dict[str, object]) -> None:
    """The init's config: marshal loads with no import (json would cost the box ~8 ms)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(marshal.dumps(data, 4))
    os.replace(tmp, path)


def _library_dir() -> str:
    """Where the driver's libraries live and the dynamic loader looks without a cache entry."""
    for d in (f"/usr/lib/{platform.machine()}-linux-gnu", "/usr/lib64", "/usr/lib"):
        if os.path.isdir(d) and not os.path.islink(d):
            return d
    raise BoxError("no system library directory found for the stand-in NVML")
