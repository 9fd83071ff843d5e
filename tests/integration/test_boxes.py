"""Sandbox boxes are real SSH hosts: namespaces, provider environment, NVML, ports, lifecycle.

Needs root and the Debian packages in `sandbox.boxes.DEBIAN_PACKAGES` (plus gcc for the
stand-in NVML). Boxes hang off bridges of their own (`fltest*`, 10.79-10.81.0.0/16), so a
sandbox that is up meanwhile is not disturbed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.util import find_spec
from pathlib import Path

import paramiko
import pynvml
import pytest

from sandbox.backend import BoxEndpoints, BoxSpec, GpuDevice, GpuSpec
from sandbox.boxes import BoxError, NamespaceBackend, sweep
from sandbox.boxes.boxinit import SECCOMP_ARCH
from sandbox.boxes.config import BOX_PATH
from sandbox.boxes.host import host_snapshot
from sandbox.boxes.proc import LOG_CAP

BRIDGE, SUBNET, PUBLIC = "fltest0", "10.79.0.0/16", "10.79.1"
amdsmi_spec = find_spec("amdsmi")  # found, not imported: its import needs libamd_smi.so
ROOT = Path(__file__).resolve().parents[2]
Started = tuple[BoxSpec, BoxEndpoints]

LISTENER = textwrap.dedent("""
    import socket
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 26611))
    s.listen()
    while True:
        c, _ = s.accept()
        c.sendall(socket.gethostname().encode() + b"\\n")
        c.close()
""")

NVML_REPORT = textwrap.dedent("""
    import json, pynvml
    pynvml.nvmlInit()
    n = pynvml.nvmlDeviceGetCount()
    hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    print(json.dumps({
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "cuda": pynvml.nvmlSystemGetCudaDriverVersion(),
        "uuids": [pynvml.nvmlDeviceGetUUID(h) for h in hs],
        "names": [pynvml.nvmlDeviceGetName(h) for h in hs],
        "module": pynvml.__file__,
    }))
""")


# --- specs ---------------------------------------------------------------------------------

def gpu(driver: str, *uuids: str) -> GpuSpec:
    return GpuSpec(driver, 12080, [
        GpuDevice(u, "NVIDIA H100 80GB HBM3", f"00000000:{0x1B + i:02X}:00.0", 80 * 2**30,
                  f"1324021{i:06d}")
        for i, u in enumerate(uuids)
    ])


def runpod_spec(pub: str, n: int, hook: str | None = None) -> BoxSpec:
    pod = f"pod{n:04d}xyz"
    ip = f"{PUBLIC}.{n}"
    return BoxSpec(
        box_id=f"runpod-{pod}", provider="runpod", hostname=f"{pod}-6441", public_ip=ip,
        env={"RUNPOD_POD_ID": pod, "RUNPOD_PUBLIC_IP": ip, "RUNPOD_GPU_COUNT": "2",
             "PUBLIC_KEY": f"{pub.strip()}\nssh-ed25519 AAAAsecond fleet@spare",
             "JOB_NOTE": 'say "hi" \\ $HOME it\'s'},
        # dockerArgs replace the image's command: a hook goes on to the image's /start.sh
        tcp_ports=[22, 26611], authorized_keys=pub,
        start_hook=f"{hook}\nexec /start.sh" if hook else None,
        gpu=gpu("580.95.05", f"GPU-{n:08x}-aaaa-4bbb-8ccc-000000000001",
                f"GPU-{n:08x}-aaaa-4bbb-8ccc-000000000002"),
        disk_gb=1, disk_kept=False, volume_gb=1, volume_path="/workspace",  # RunPod's disks
    )


def vast_spec(pub: str, n: int, hook: str | None = None) -> BoxSpec:
    iid = 2700000 + n
    ip = f"{PUBLIC}.{n}"
    return BoxSpec(
        box_id=f"vast-{iid}", provider="vast", hostname=f"C.{iid}", public_ip=ip,
        env={"VAST_CONTAINERLABEL": f"C.{iid}", "CONTAINER_ID": str(iid), "PUBLIC_IPADDR": ip},
        tcp_ports=[22, 26611], authorized_keys=pub, start_hook=hook,
        gpu=gpu("570.172.08", f"GPU-{n:08x}-dddd-4eee-8fff-000000000001"), disk_gb=1,
    )


# --- helpers -------------------------------------------------------------------------------

class Key:
    def __init__(self, path: Path) -> None:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                       check=True)
        self.pkey = paramiko.Ed25519Key.from_private_key_file(str(path))
        self.pub = path.with_suffix(".pub").read_text()


def connect(ep: BoxEndpoints, key: Key) -> paramiko.SSHClient:
    """Log in as root with `key`, accepting only the host key the backend reported."""
    assert ep.host_key is not None
    kind, blob = ep.host_key.split()
    client = paramiko.SSHClient()
    client.get_host_keys().add(f"[{ep.ssh_host}]:{ep.ssh_port}", kind,
                               paramiko.PKey.from_type_string(kind, base64.b64decode(blob)))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(ep.ssh_host, ep.ssh_port, "root", pkey=key.pkey, allow_agent=False,
                   look_for_keys=False, timeout=10)
    return client


def run(client: paramiko.SSHClient, cmd: str) -> str:
    _, out, err = client.exec_command(cmd, timeout=30)
    text = out.read().decode()
    rc = out.channel.recv_exit_status()
    assert rc == 0, f"{cmd!r} exited {rc}: {err.read().decode()}"
    return text


def box_env(client: paramiko.SSHClient) -> dict[str, str]:
    return environ(run(client, "cat /proc/self/environ"))


def environ(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


def eventually(check: Callable[[], object], what: str, within: float = 15.0) -> None:
    """Poll `check` until truthy; a bounded wait for asynchronous work, not a timing test."""
    deadline = time.monotonic() + within
    while True:
        try:
            if check():
                return
        except (OSError, AssertionError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def ns_of(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def processes_in(kind: str, ns: str) -> list[int]:
    """Host pids of the live processes in namespace `ns` (zombies have no namespaces)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / kind) == ns:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def identities(pids: list[int]) -> set[tuple[int, str]]:
    """(pid, start time): tells a process from a later one that reuses its pid."""
    found = set()
    for pid in pids:
        try:
            found.add((pid, Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]))
        except OSError:
            pass
    return found


def links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)", out, re.M)}


AMDSMI_REPORT = textwrap.dedent("""
    import json, amdsmi as a
    a.amdsmi_init()
    hs = a.amdsmi_get_processor_handles()
    print(json.dumps({
        "module": a.__file__,
        "drivers": [a.amdsmi_get_gpu_driver_info(h)["driver_version"] for h in hs],
        "rocm": a.amdsmi_get_rocm_version(),
        "uuids": [a.amdsmi_get_gpu_device_uuid(h) for h in hs],
        "names": [a.amdsmi_get_gpu_asic_info(h)["market_name"] for h in hs],
    }))
    a.amdsmi_shut_down()
""")
NVML_REFUSES = textwrap.dedent("""
    import pynvml
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        print("library not found")
""")


def amd_gpu(driver: str, rocm: str, *uuids: str) -> GpuSpec:
    return GpuSpec(driver, 0, [
        GpuDevice(u, "AMD Instinct MI300X", f"0000:{0x1B + i:02x}:00.0", 192 * 2**30)
        for i, u in enumerate(uuids)
    ], vendor="amd", rocm_version=rocm)


def install_amdsmi(client: paramiko.SSHClient) -> None:
    """The amdsmi binding is a pure-Python package: copy the project's pinned one over SFTP."""
    package = Path(amdsmi_spec.submodule_search_locations[0])  # type: ignore[index]
    run(client, "mkdir -p /root/pylib/amdsmi")
    with client.open_sftp() as sftp:
        for path in package.glob("*.py"):
            sftp.put(str(path), f"/root/pylib/amdsmi/{path.name}")


def nvml_report(client: paramiko.SSHClient) -> dict[str, object]:
    out = run(client, f"PYTHONPATH=/root/pylib /usr/bin/python3 -c '{NVML_REPORT}'")
    return json.loads(out)


def install_pynvml(client: paramiko.SSHClient) -> None:
    """nvidia-ml-py is one pure-Python module: copy the project's pinned one over SFTP."""
    run(client, "mkdir -p /root/pylib")
    with client.open_sftp() as sftp:
        sftp.put(pynvml.__file__, "/root/pylib/pynvml.py")


def start_listener(client: paramiko.SSHClient) -> None:
    run(client, f"nohup /usr/bin/python3 -c '{LISTENER}' </dev/null >/dev/null 2>&1 &")


def read_banner(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=5) as s:
        return s.makefile().readline().strip()


# --- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Key:
    return Key(tmp_path_factory.mktemp("key") / "id_ed25519")


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceBackend]:
    state = tmp_path_factory.mktemp("boxes")
    b = NamespaceBackend(state, bridge=BRIDGE, subnet=SUBNET)
    try:
        yield b
    finally:
        b.close()
        sweep(state)


@pytest.fixture(scope="module")
def boxes(backend: NamespaceBackend, key: Key) -> Iterator[dict[str, Started]]:
    """One RunPod and one Vast box, up for the whole module: only for tests that leave them
    as they found them (a test that starts a process or changes the box uses `fresh`)."""
    hook = "cat /proc/$$/environ > /root/hook-env"
    specs = {"runpod": runpod_spec(key.pub, 1, hook=hook), "vast": vast_spec(key.pub, 2, hook=hook)}
    started: dict[str, Started] = {}
    try:
        for name, spec in specs.items():
            started[name] = (spec, backend.start(spec))
        yield started
    finally:
        for spec, _ in started.values():
            backend.destroy(spec.box_id)


@pytest.fixture
def fresh(backend: NamespaceBackend, key: Key) -> Iterator[Callable[..., Started]]:
    """Start throwaway boxes for tests that change them; destroyed afterwards."""
    made: list[str] = []
    counter = iter(range(10, 100))

    def make(provider: str = "vast", hook: str | None = None) -> Started:
        maker = vast_spec if provider == "vast" else runpod_spec
        spec = maker(key.pub, next(counter), hook)
        made.append(spec.box_id)
        return spec, backend.start(spec)

    try:
        yield make
    finally:
        for box_id in made:
            backend.destroy(box_id)


PROVIDERS = ["runpod", "vast"]


# --- a box is an SSH host ------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_root_logs_in_with_the_fleet_key_and_the_pinned_host_key(boxes, key, provider):
    spec, ep = boxes[provider]
    assert (ep.ssh_host, ep.public_ip) == (spec.public_ip, spec.public_ip)
    assert ep.ports[22] == ep.ssh_port and set(ep.ports) == {22, 26611}
    assert all(10000 <= p < 60000 for p in ep.ports.values())
    with connect(ep, key) as client:
        assert run(client, "id -un").strip() == "root"
        assert run(client, "echo $HOME; pwd").split() == ["/root", "/root"]


def test_other_keys_and_passwords_are_refused(boxes, tmp_path):
    _, ep = boxes["vast"]
    stranger = Key(tmp_path / "stranger")
    with pytest.raises(paramiko.AuthenticationException):
        connect(ep, stranger)
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    with pytest.raises(paramiko.AuthenticationException):
        client.connect(ep.ssh_host, ep.ssh_port, "root", password="root", allow_agent=False,
                       look_for_keys=False, timeout=10)
    client.close()


def test_sftp_works(boxes, key, tmp_path):
    _, ep = boxes["runpod"]
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(3 * 2**20))
    with connect(ep, key) as client, client.open_sftp() as sftp:
        sftp.put(str(src), "/root/payload.bin")
        try:
            assert run(client, "sha256sum /root/payload.bin").split()[0] == \
                subprocess.run(["sha256sum", str(src)], capture_output=True, text=True,
                               check=True).stdout.split()[0]
        finally:
            sftp.remove("/root/payload.bin")  # the shared box as it was


@pytest.mark.parametrize("provider", PROVIDERS)
def test_hostname_is_the_boxes_own(boxes, key, provider):
    spec, ep = boxes[provider]
    with connect(ep, key) as client:
        assert run(client, "hostname").strip() == spec.hostname
        assert run(client, "cat /etc/hostname").strip() == spec.hostname
    assert socket.gethostname() != spec.hostname


@pytest.mark.parametrize("provider", PROVIDERS)
def test_process_table_is_the_boxes_own(boxes, key, provider):
    _, ep = boxes[provider]
    with connect(ep, key) as client:
        rows = [line.split(None, 1) for line in run(client, "ps -e -o pid=,comm=").splitlines()]
        args = run(client, "ps -e -o args=")
    procs = {int(pid): comm.strip() for pid, comm in rows}
    assert procs[1] == "box-init"
    assert len(procs) <= 8, procs  # init, sshd, this session and ps: nothing of the host's
    # and RunPod's image's /start.sh, which stays as `sleep`
    assert set(procs.values()) <= {"box-init", "sshd", "bash", "sh", "ps", "sleep"}, procs
    host_args = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    assert host_args not in args  # this very test process is invisible


@pytest.mark.parametrize("provider", PROVIDERS)
def test_root_home_and_tmp_are_the_boxes_own(backend, boxes, key, provider):
    _, ep = boxes[provider]
    other = boxes["vast" if provider == "runpod" else "runpod"][0]
    secret = backend.state_dir / other.box_id / "disk" / "upper" / "etc" / "ssh" / \
        "ssh_host_ed25519_key"
    assert secret.exists()
    marker = f"host-only-{os.getpid()}"
    Path(f"/tmp/{marker}").write_text("x")
    try:
        with connect(ep, key) as client:
            assert run(client, f"test ! -e /tmp/{marker} && echo absent").strip() == "absent"
            assert run(client, f"test ! -e {secret} && echo hidden").strip() == "hidden"
            assert ".pyenv" not in run(client, "ls -A /root")
    finally:
        Path(f"/tmp/{marker}").unlink()


def test_environment_is_runpods(boxes, key):
    spec, ep = boxes["runpod"]
    with connect(ep, key) as client:
        env = box_env(client)
        eventually(lambda: "RUNPOD_POD_ID" in run(client, "cat /root/hook-env"), "hook ran")
        hook_env = environ(run(client, "cat /root/hook-env"))
        init_env = environ(run(client, "cat /proc/1/environ"))
    wanted = {
        "RUNPOD_POD_ID": spec.env["RUNPOD_POD_ID"],
        "RUNPOD_PUBLIC_IP": spec.public_ip,
        "RUNPOD_GPU_COUNT": "2",
        "RUNPOD_TCP_PORT_22": str(ep.ports[22]),
        "RUNPOD_TCP_PORT_26611": str(ep.ports[26611]),
        "JOB_NOTE": 'say "hi" \\ $HOME it\'s',
        "PATH": BOX_PATH,
    }
    assert {k: env.get(k) for k in wanted} == wanted
    assert not any(k.startswith("VAST_") for k in env)
    # The container's own processes (PID 1, the start hook) have all of it, multi-line too;
    # sshd_config cannot carry a value that spans lines, so sessions go without those.
    full = {**wanted, "PUBLIC_KEY": spec.env["PUBLIC_KEY"]}
    assert {k: hook_env.get(k) for k in full} == full
    assert {k: init_env.get(k) for k in full} == full
    assert "PUBLIC_KEY" not in env


def test_environment_is_vasts(boxes, key):
    spec, ep = boxes["vast"]
    with connect(ep, key) as client:
        env = box_env(client)
    wanted = {
        "VAST_CONTAINERLABEL": spec.hostname,
        "CONTAINER_ID": spec.env["CONTAINER_ID"],
        "PUBLIC_IPADDR": spec.public_ip,
        "VAST_TCP_PORT_22": str(ep.ports[22]),
        "VAST_TCP_PORT_26611": str(ep.ports[26611]),
        "PATH": BOX_PATH,
    }
    assert {k: env.get(k) for k in wanted} == wanted
    assert not any(k.startswith("RUNPOD_") for k in env)


# --- GPUs through the stand-in NVML -----------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_nvidia_ml_py_reports_the_advertised_driver_and_uuids(backend, boxes, key, provider):
    spec, ep = boxes[provider]
    with connect(ep, key) as client:
        install_pynvml(client)
        try:
            report = nvml_report(client)
            lib = run(client, "sha256sum /usr/lib/*-linux-gnu/libnvidia-ml.so.1").split()
        finally:
            run(client, "rm -rf /root/pylib")  # the shared box as it was
    stand_in, = (backend.state_dir / "image").glob("usr/lib*/**/libnvidia-ml.so.1")
    assert report["module"] == "/root/pylib/pynvml.py"
    assert report["driver"] == spec.gpu.driver_version
    assert report["cuda"] == spec.gpu.cuda_driver_version
    assert report["uuids"] == [d.uuid for d in spec.gpu.devices]
    assert report["names"] == [d.name for d in spec.gpu.devices]
    assert lib[0] == hashlib.sha256(stand_in.read_bytes()).hexdigest()  # where drivers put it


def test_driver_drift_changes_what_a_live_box_reports(backend, fresh, key):
    spec, ep = fresh("runpod")
    drifted = gpu("580.82.07", "GPU-feedface-0000-4000-8000-000000000001")
    with connect(ep, key) as client:
        install_pynvml(client)
        assert nvml_report(client)["driver"] == "580.95.05"
        backend.set_gpu(spec.box_id, drifted)
        after = nvml_report(client)
    assert after["driver"] == "580.82.07"
    assert after["uuids"] == ["GPU-feedface-0000-4000-8000-000000000001"]


def test_an_amd_box_reports_its_driver_rocm_and_uuids_through_amdsmi_and_has_no_nvml(
        backend, key):
    spec = vast_spec(key.pub, 30)
    spec.gpu = amd_gpu("6.12.12", "6.4.1", "a1ff74a1-0000-1000-80fd-5fe0a2f6c3b1",
                       "a1ff74a1-0000-1000-80fd-5fe0a2f6c3b2")
    ep = backend.start(spec)
    try:
        with connect(ep, key) as client:
            install_amdsmi(client)
            install_pynvml(client)
            report = json.loads(run(client, f"PYTHONPATH=/root/pylib /usr/bin/python3 -c "
                                            f"'{AMDSMI_REPORT}'"))
            nvml = run(client, f"PYTHONPATH=/root/pylib /usr/bin/python3 -c '{NVML_REFUSES}'")
            backend.set_gpu(spec.box_id, amd_gpu("6.12.10", "6.4.1", *report["uuids"]))
            drifted = json.loads(run(client, f"PYTHONPATH=/root/pylib /usr/bin/python3 -c "
                                             f"'{AMDSMI_REPORT}'"))
    finally:
        backend.destroy(spec.box_id)
    assert report["module"] == "/root/pylib/amdsmi/__init__.py"  # the box's Python, the binding
    assert report["drivers"] == ["6.12.12", "6.12.12"]
    assert report["rocm"] == [True, "6.4.1"]
    assert report["uuids"] == [d.uuid for d in spec.gpu.devices]
    assert report["names"] == ["AMD Instinct MI300X"] * 2
    assert nvml.strip() == "library not found"
    assert drifted["drivers"] == ["6.12.10", "6.12.10"]  # driver drift reaches an AMD box


# --- ports -------------------------------------------------------------------------------

def test_p2p_port_is_reachable_through_the_public_mapping(fresh, key):
    # boxes of its own: the listeners it leaves would show in the shared boxes' process tables
    (rp_spec, rp), (va_spec, va) = fresh("runpod"), fresh("vast")
    with connect(rp, key) as rp_client, connect(va, key) as va_client:
        start_listener(rp_client)  # both boxes listen on the same internal port
        start_listener(va_client)
        for spec, ep in ((rp_spec, rp), (va_spec, va)):
            eventually(lambda ep=ep: read_banner(ep.public_ip, ep.ports[26611]),
                       f"{spec.box_id} listens")
            assert read_banner(ep.public_ip, ep.ports[26611]) == spec.hostname  # from the host
        dial = (f"/usr/bin/python3 -c 'import socket; s = socket.create_connection("
                f"(\"{va.public_ip}\", {va.ports[26611]}), timeout=5); "
                f"print(s.makefile().readline().strip())'")
        assert run(rp_client, dial).strip() == va_spec.hostname  # from a box, as a peer dials


def test_boxes_start_concurrently(backend, key):
    specs = [vast_spec(key.pub, n) for n in range(40, 44)]
    try:
        with ThreadPoolExecutor(len(specs)) as pool:
            eps = list(pool.map(backend.start, specs))
        assert len({(ep.public_ip, ep.ssh_port) for ep in eps}) == len(specs)
        for spec, ep in zip(specs, eps, strict=True):
            with connect(ep, key) as client:
                assert run(client, "hostname").strip() == spec.hostname
    finally:
        for spec in specs:
            backend.destroy(spec.box_id)


def test_public_ports_do_not_collide(backend, boxes, fresh):
    _, other = fresh("runpod")
    taken = [(ep.public_ip, p) for _, ep in boxes.values() for p in ep.ports.values()]
    taken += [(other.public_ip, p) for p in other.ports.values()]
    assert len(taken) == len(set(taken))


# --- a box is its own machine: its own root and disk -----------------------------------------

SHARED_PATHS = ("/post_start.sh", "/opt/x", "/usr/local/bin/x", "/workspace/x")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_two_boxes_writing_the_same_paths_each_see_only_their_own(fresh, key, provider):
    before = host_snapshot()
    (_, a), (_, b) = fresh(provider), fresh(provider)
    with connect(a, key) as ca, connect(b, key) as cb:
        for client, name in ((ca, "a"), (cb, "b")):
            run(client, "; ".join(f"mkdir -p $(dirname {p}) && echo {name} > {p}"
                                  for p in SHARED_PATHS))
        for client, name in ((ca, "a"), (cb, "b")):
            assert run(client, "cat " + " ".join(SHARED_PATHS)).split() == [name] * 4
        run(ca, "rm /opt/x")
        assert run(cb, "cat /opt/x").strip() == "b"
    assert host_snapshot() == before
    for path in SHARED_PATHS:
        assert not Path(path).exists(), f"{path} reached the host"


def test_a_box_that_deletes_usr_breaks_only_itself(boxes, fresh, key):
    _, victim = fresh("vast")
    with connect(victim, key) as client:
        client.exec_command("rm -rf /usr/bin /usr/lib/python3*")[1].channel.recv_exit_status()
        _, out, _ = client.exec_command("/usr/bin/python3 -c 'print(1)'")
        assert out.channel.recv_exit_status() != 0  # broken, as a real box would be
    _, other = boxes["vast"]
    with connect(other, key) as client:
        assert run(client, "/usr/bin/python3 -c 'print(6 * 7)'").strip() == "42"
    res = subprocess.run(["/usr/bin/python3", "-c", "print(6 * 7)"], capture_output=True,
                         text=True, check=True)
    assert res.stdout.strip() == "42"


def test_a_box_that_fills_its_disk_gets_enospc_and_nothing_else_does(boxes, fresh, key):
    spec, ep = fresh("vast")  # disk_gb = 1
    host_free = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    with connect(ep, key) as client:
        _, out, err = client.exec_command(
            "dd if=/dev/zero of=/opt/fill bs=1M count=2048 2>&1; echo rc=$?", timeout=120)
        text = out.read().decode()
        assert "No space left on device" in text and "rc=1" in text, text
        size = int(run(client, "stat -c %s /opt/fill"))
        assert 0.8 * 2**30 < size < 2**30  # the rented size, less the filesystem's own
        run(client, "rm /opt/fill")
        run(client, "echo fine > /root/after")  # the box itself recovers once it frees space
    _, other = boxes["vast"]
    with connect(other, key) as client:
        run(client, "dd if=/dev/zero of=/root/ok bs=1M count=16 && rm /root/ok")
    # the operator's disk never saw more than the box's size
    assert host_free - os.statvfs("/").f_bavail * os.statvfs("/").f_frsize < 2**30


def attempt(client: paramiko.SSHClient, cmd: str) -> tuple[int, str]:
    _, out, _ = client.exec_command(f"{cmd} 2>&1", timeout=30)
    text = out.read().decode()
    return out.channel.recv_exit_status(), text


def test_root_in_a_box_cannot_undo_its_isolation(backend, boxes, key):
    """A container runtime's default capabilities, without CAP_MKNOD: no unmount of what hides
    the host's files, no remount of a read-only view, no mount, no device node, no kernel
    setting (all of these worked while a box kept every capability)."""
    _, ep = boxes["vast"]
    tries = {
        "unmount the hidden state dir": f"umount {backend.state_dir}",
        "remount the sys dir writable": "mount -o remount,bind,rw /run/sandbox",
        "mount a filesystem": "mount -t tmpfs fresh /mnt",
        "make a device node": "mknod /root/disk b 7 0",
        "set a kernel setting": "cat /proc/sys/kernel/printk_ratelimit "
                                "> /proc/sys/kernel/printk_ratelimit",
        "write the hostname file": "echo other > /etc/hostname",
        # a second review: these let a box reach the host or another box
        "open a raw socket (send as another box's MAC)":
            "python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'",
        "make a user namespace": "unshare --user --map-root-user true",
        "add a key to root's user keyring (the host's)": "python3 -c " + shlex.quote(
            "import ctypes, os, sys; from sandbox_nr import NR; libc = ctypes.CDLL(None, "
            "use_errno=True); sys.exit(libc.syscall(NR, b'user', b'fleet-test', b'v', 1, -4)"
            " < 0)"),
    }
    nr = SECCOMP_ARCH[os.uname().machine][1]["add_key"]
    with connect(ep, key) as client:
        run(client, f"mkdir -p /root/nr && echo 'NR = {nr}' > /root/nr/sandbox_nr.py")
        tries = {what: f"PYTHONPATH=/root/nr {cmd}" for what, cmd in tries.items()}
        for what, cmd in tries.items():
            rc, text = attempt(client, cmd)
            assert rc != 0, f"{what}: {text}"
        effective = int(run(client, "grep CapEff /proc/self/status").split()[1], 16)
        assert effective & (1 << 21) == 0  # CAP_SYS_ADMIN
        assert effective & (1 << 27) == 0  # CAP_MKNOD
        assert effective & (1 << 13) == 0  # CAP_NET_RAW
        # what the provider gave still works: ports, NVML config, the init's environment
        assert run(client, "cat /proc/1/environ | tr '\\0' '\\n' | grep -c TCP_PORT") != "0"
        assert run(client, "readlink /etc/sandbox-nvml.json").strip() == \
            "/run/sandbox/nvml.json"


def test_a_box_cannot_fill_the_hosts_disk_through_its_logs(backend, fresh, key):
    """The init's and sshd's output reach the host through pipes, relayed up to LOG_CAP: the
    box can reopen them through /proc, but never write more than that into the host's logs."""
    spec, ep = fresh("vast")
    mib = 2 * LOG_CAP >> 20
    with connect(ep, key) as client:
        for pid in (1, "$(pgrep -x sshd | head -1)"):
            attempt(client, f"dd if=/dev/zero of=/proc/{pid}/fd/2 bs=1M count={mib}")
    logs = backend.state_dir / spec.box_id / "log"
    for name in ("init.log", "sshd.log"):
        eventually(lambda name=name: (logs / name).stat().st_size >= LOG_CAP, f"{name} capped")
        assert (logs / name).stat().st_size <= LOG_CAP + 100
        assert b"log capped" in (logs / name).read_bytes()[-100:]


def test_the_hosts_secrets_are_not_in_a_box(boxes, key):
    _, ep = boxes["runpod"]
    with connect(ep, key) as client:
        fields = {line.split(":")[1] for line in run(client, "cat /etc/shadow").splitlines()}
        assert fields == {"*"}  # the host's accounts, no password of theirs
        # the box's host key is its own, made in the box: never the host's
        assert run(client, "ls /etc/ssh | grep ssh_host_").split() == [
            "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"]
        own = run(client, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()[:2]
    hosts = [p.read_text().split()[:2] for p in Path("/etc/ssh").glob("ssh_host_*.pub")]
    assert own == ep.host_key.split() and own not in hosts


def test_a_box_that_links_its_etc_away_leads_the_host_nowhere(backend, fresh, key, tmp_path):
    """The host writes a box's hostname and hosts at every start: never through the box's
    files (a box that replaced its /etc with a link once had the host write where it said)."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "hosts").write_text("the host's own\n")
    spec, ep = fresh("vast")
    with connect(ep, key) as client:
        attempt(client, f"cp -a /etc /etc.copy; rm -rf /etc; ln -s {victim} /etc")
    try:
        backend.restart(spec.box_id)
    except BoxError:
        pass  # a box without its /etc may not come up: that is its own business
    assert sorted(p.name for p in victim.iterdir()) == ["hosts"]
    assert (victim / "hosts").read_text() == "the host's own\n"


@pytest.mark.parametrize("path", ["/../../{escape}", "relative", "/run/vol", "/proc/vol", "/"])
def test_a_volume_path_outside_the_box_is_refused(backend, key, tmp_path, path):
    escape = tmp_path / "escape"
    spec = runpod_spec(key.pub, 99)
    spec.volume_path = path.format(escape=str(escape).lstrip("/"))
    with pytest.raises(BoxError, match="volume mount path"):
        backend.start(spec)
    assert not escape.exists()
    assert not (backend.state_dir / spec.box_id).exists()


def test_without_loop_devices_a_disk_is_a_tmpfs_of_its_size(tmp_path, key, monkeypatch):
    """Where a machine has no loop devices (a container), each disk is a tmpfs of the rented
    size: the same ENOSPC, the same providers' rules, nothing left behind."""
    from sandbox.boxes import disks

    monkeypatch.setattr(disks, "loop_devices_work", lambda: False)
    state = tmp_path / "boxes"
    b = NamespaceBackend(state, bridge="fltest4", subnet="10.82.0.0/16")
    try:
        spec = runpod_spec(key.pub, 3)
        spec.public_ip, spec.disk_gb, spec.volume_gb = "10.82.1.3", 0.25, 0.25
        ep = b.start(spec)
        assert disks.loops_under(state) == []
        options = {line.split()[4]: line.split()[5] for line in
                   Path("/proc/self/mountinfo").read_text().splitlines()}
        for disk in ("disk", "volume"):
            assert {"nosuid", "nodev"} <= set(options[str(state / spec.box_id / disk)].split(","))
        with connect(ep, key) as client:
            rc, text = attempt(client, "dd if=/dev/zero of=/opt/fill bs=1M count=400")
            assert rc != 0 and "No space left on device" in text
            run(client, "rm /opt/fill; echo kept > /workspace/kept; echo lost > /root/lost")
        ep = b.restart(spec.box_id)
        with connect(ep, key) as client:
            assert run(client, "cat /workspace/kept; ls -A /root").split() == ["kept"]
    finally:
        b.close()
    assert disks.mounts_under(state) == []
    assert not [p for p in state.iterdir() if p.name not in ("nvml-build", "amdsmi-build")]


def test_a_box_whose_sshd_cannot_start_fails_at_once_in_sshds_words(backend, key, monkeypatch):
    """Its init lives on, so only the init's word says sshd is gone: the start fails then,
    quoting sshd's own log, not at the deadline with another message."""
    from sandbox.boxes import sshd

    monkeypatch.setattr(sshd, "RUN_DIRS", ())  # no privilege separation directory in the box
    monkeypatch.setattr(backend, "ready_timeout", 600.0)  # waiting for the port: ten minutes
    spec = vast_spec(key.pub, 97)
    with pytest.raises(BoxError, match="(?s)its sshd exited before it listened.*"
                                       "Missing privilege separation directory"):
        backend.start(spec)
    assert not (backend.state_dir / spec.box_id).exists()  # nothing of it is left


# --- lifecycle ---------------------------------------------------------------------------

def test_host_death_leaves_no_process(backend, fresh, key):
    spec, ep = fresh()
    with connect(ep, key) as client:
        run(client, "nohup sleep 1000 </dev/null >/dev/null 2>&1 &")
    pid = backend.init_pid(spec.box_id)
    assert pid is not None
    pidns, netns = ns_of(pid, "pid"), ns_of(pid, "net")
    assert len(processes_in("pid", pidns)) >= 3  # init, sshd, sleep: the probe sees them
    backend.kill(spec.box_id)
    assert processes_in("pid", pidns) == []
    assert processes_in("net", netns) == []
    with pytest.raises(OSError):
        socket.create_connection((ep.ssh_host, ep.ssh_port), timeout=2)


def test_destroy_leaves_no_process_and_no_disk(backend, fresh, key):
    before = links()
    spec, ep = fresh()
    with connect(ep, key) as client:
        run(client, "echo data > /root/data; nohup sleep 1000 </dev/null >/dev/null 2>&1 &")
    pid = backend.init_pid(spec.box_id)
    assert pid is not None
    pidns = ns_of(pid, "pid")
    disk = backend.state_dir / spec.box_id
    assert (disk / "disk" / "upper" / "root" / "data").read_text() == "data\n"
    backend.destroy(spec.box_id)
    assert processes_in("pid", pidns) == []
    assert not disk.exists()
    assert links() == before
    with pytest.raises(OSError):
        socket.create_connection((ep.ssh_host, ep.ssh_port), timeout=2)


def test_container_restart_keeps_the_disk_and_reruns_the_start_hook(backend, fresh, key):
    hook = 'echo "ran $(date +%s%N)" >> /root/hook.log'
    spec, ep = fresh("vast", hook=hook)
    with connect(ep, key) as client:
        eventually(lambda: run(client, "cat /root/hook.log").count("ran") == 1, "first hook")
        run(client, "echo kept > /root/keep; echo kept > /tmp/keep; "
                    "nohup sleep 1000 </dev/null >/dev/null 2>&1 &")
    old = backend.init_pid(spec.box_id)
    assert old is not None
    before = identities(processes_in("pid", ns_of(old, "pid")))
    assert len(before) >= 3
    backend.restart(spec.box_id)
    # every process died (the new box may reuse the namespace's inode number, not its pids)
    assert identities([pid for pid, _ in before]) & before == set()
    with connect(ep, key) as client:  # sshd is back on the same port with the same host key
        assert run(client, "cat /root/keep /tmp/keep").split() == ["kept", "kept"]
        assert "sleep" not in run(client, "ps -e -o comm=").split()
        eventually(lambda: run(client, "cat /root/hook.log").count("ran") == 2, "hook again")
        assert box_env(client)["VAST_TCP_PORT_22"] == str(ep.ssh_port)


def test_start_after_kill_boots_the_same_disk(backend, fresh, key):
    spec, ep = fresh("vast")
    with connect(ep, key) as client:
        run(client, "echo kept > /root/keep; echo kept > /opt/keep")
    backend.kill(spec.box_id)
    again = backend.start(spec)  # a stopped instance resumed
    assert again.host_key == ep.host_key
    with connect(again, key) as client:
        assert run(client, "cat /root/keep /opt/keep").split() == ["kept", "kept"]


def served_key(ep: BoxEndpoints) -> str:
    """The host key the box's sshd proves it holds, read over SSH as the fleet reads it."""
    from fleet.boxes.sshkeys import fetch_host_key

    return fetch_host_key(ep.ssh_host, ep.ssh_port)


def test_a_runpod_restart_makes_new_host_keys_and_vast_keeps_its_own(backend, fresh, key):
    """RunPod's image makes host keys at start where /etc/ssh has none, and a restarted pod's
    container disk is new; Vast keeps its disk, and its key with it. The endpoints say the
    key the box's sshd serves."""
    pod, pod_ep = fresh("runpod")
    inst, inst_ep = fresh("vast")
    before = {"runpod": served_key(pod_ep), "vast": served_key(inst_ep)}
    assert before == {"runpod": pod_ep.host_key, "vast": inst_ep.host_key}
    again = {"runpod": backend.restart(pod.box_id), "vast": backend.restart(inst.box_id)}
    after = {"runpod": served_key(pod_ep), "vast": served_key(inst_ep)}  # same ports
    assert after["vast"] == before["vast"]
    assert after["runpod"] != before["runpod"], "a new container disk kept its host key"
    assert {name: ep.host_key for name, ep in again.items()} == after
    with connect(again["runpod"], key) as client:
        pub = run(client, "cat /etc/ssh/ssh_host_ed25519_key.pub").split()[:2]
    assert " ".join(pub) == after["runpod"]


def test_a_runpod_hook_that_restores_keys_before_the_image_start_keeps_the_key(
        backend, fresh, key):
    """The start command runs before the image's start step, as dockerArgs do: keys it puts
    back into /etc/ssh are there when the image looks, so no new ones are made."""
    restore = ("[ -f /workspace/keys/ssh_host_ed25519_key ] && "
               "cp -p /workspace/keys/ssh_host_* /etc/ssh/")
    pod, ep = fresh("runpod", hook=restore)
    with connect(ep, key) as client:
        run(client, "mkdir -p /workspace/keys && cp -p /etc/ssh/ssh_host_* /workspace/keys/")
    again = backend.restart(pod.box_id)
    assert served_key(ep) == ep.host_key
    assert again.host_key == ep.host_key


@pytest.mark.parametrize("how", ["restart", "stop and start"])
def test_runpod_keeps_only_its_volume(backend, fresh, key, how):
    """RunPod drops the container disk at every stop and restart; the volume stays."""
    hook = "echo ran >> /workspace/hook.log"
    spec, ep = fresh("runpod", hook=hook)
    with connect(ep, key) as client:
        eventually(lambda: run(client, "cat /workspace/hook.log").count("ran") == 1, "hook")
        run(client, "echo lost > /root/lost; echo lost > /opt/lost; echo kept > /workspace/kept")
    if how == "restart":
        ep = backend.restart(spec.box_id)
    else:
        backend.kill(spec.box_id)
        ep = backend.start(spec)
    with connect(ep, key) as client:
        assert run(client, "cat /workspace/kept").strip() == "kept"
        assert run(client, "ls -A /root; ls /opt/lost 2>&1 || true").strip().endswith(
            "No such file or directory")
        eventually(lambda: run(client, "cat /workspace/hook.log").count("ran") == 2, "again")
        # the new container disk is a whole new one: the box's own dirs and hostname are back
        assert run(client, "hostname; stat -c %a /tmp").split() == [spec.hostname, "1777"]


# --- nothing left behind -----------------------------------------------------------------

def addresses() -> str:
    return subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout


def test_a_second_backend_on_a_network_in_use_is_refused_and_harms_nothing(boxes, key, tmp_path):
    before = (links(), addresses())
    for bridge in ("fltest3", BRIDGE):  # same subnet on another bridge; the same bridge
        with pytest.raises(BoxError, match="another sandbox"):
            NamespaceBackend(tmp_path / "second", bridge=bridge, subnet=SUBNET)
    assert (links(), addresses()) == before
    assert sweep(tmp_path / "second") == []  # it recorded no network to sweep
    spec, ep = boxes["vast"]
    with connect(ep, key) as client:
        assert run(client, "hostname").strip() == spec.hostname


def _footprint(backend: NamespaceBackend, box_ids: list[str]) -> dict[str, str]:
    """Namespaces of running boxes, to check they are gone later."""
    out = {}
    for box_id in box_ids:
        pid = backend.init_pid(box_id)
        assert pid is not None
        for kind in ("pid", "net", "mnt"):
            out[f"{box_id}/{kind}"] = ns_of(pid, kind)
    return out


def assert_nothing_left(state: Path, bridge: str, subnet_prefix: str,
                        namespaces: dict[str, str]) -> None:
    for key_, ns in namespaces.items():
        assert processes_in(key_.rsplit("/", 1)[1], ns) == [], key_
    assert not [name for name in links() if name.startswith(bridge)]
    assert f" {subnet_prefix}." not in addresses()
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(state) not in mounts
    for ns in namespaces.values():  # no namespace kept alive by a bind mount either
        assert ns.split(":", 1)[1] not in mounts
    from sandbox.boxes.cleanup import box_processes

    assert box_processes(state) == {}
    assert not [p for p in state.iterdir() if (p / "disk").exists()]
    from sandbox.boxes.disks import loops_under

    assert loops_under(state) == []


def test_close_leaves_nothing_behind(tmp_path, key):
    state = tmp_path / "boxes"
    b = NamespaceBackend(state, bridge="fltest1", subnet="10.80.0.0/16")
    try:
        specs = [runpod_spec(key.pub, 1), vast_spec(key.pub, 2)]
        for spec in specs:
            spec.public_ip = spec.public_ip.replace("10.79.", "10.80.")
            b.start(spec)
        namespaces = _footprint(b, [s.box_id for s in specs])
        assert len(links() & {"fltest1", "fltest1-1", "fltest1-2"}) == 3
    finally:
        b.close()
    assert_nothing_left(state, "fltest1", "10.80", namespaces)


def test_sweep_cleans_up_after_a_crashed_run(tmp_path, key):
    state = tmp_path / "boxes"
    crash = textwrap.dedent(f"""
        import os
        from sandbox.backend import BoxSpec, GpuSpec
        from sandbox.boxes import NamespaceBackend
        b = NamespaceBackend({str(state)!r}, bridge="fltest2", subnet="10.81.0.0/16")
        spec = BoxSpec("vast-3", "vast", "C.3", {{"CONTAINER_ID": "3"}}, [22], "10.81.1.3",
                       {key.pub!r}, GpuSpec("580.95.05", 12080), "sleep 1000")
        b.start(spec)
        print(b.init_pid(spec.box_id), flush=True)
        os._exit(0)  # no close(): the box outlives its backend
    """)
    try:
        out = subprocess.run([sys.executable, "-c", crash], capture_output=True, text=True,
                             cwd=ROOT, check=True, timeout=120).stdout
        pid = int(out.split()[-1])
        namespaces = {f"crashed/{kind}": ns_of(pid, kind) for kind in ("pid", "net", "mnt")}
        assert processes_in("pid", namespaces["crashed/pid"])  # still running
    finally:
        removed = sweep(state)
    assert any(r.startswith("process") for r in removed)
    assert_nothing_left(state, "fltest2", "10.81", namespaces)
