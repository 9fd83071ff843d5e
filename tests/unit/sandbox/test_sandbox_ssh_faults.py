"""The SSH faults at the providers' own boundaries: a box whose sshd logs in but never runs the
command (`sshd_hang`), and a provider whose SSH path is down while its boxes run on
(`ssh_path_cut`). First as the world hands them to its backend, then on real boxes through the
fleet's own `ssh`: those tests need root, and run in a network namespace of their own."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyinfra.api.facts import FactBase

from fleet.boxes import boxssh
from sandbox.boxes import NamespaceBackend, sweep
from sandbox.boxes.config import HUNG_LOGIN
from sandbox.boxes.layout import BoxPaths
from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox
from sandbox.world import Instance, World

Boot = Callable[[World], None]
CLONE_NEWNET = 0x40000000
AGENT_PORT = 26611
# the box's stand-in agent, started by its start hook: it answers with its host and its pid
AGENT = f"""exec /usr/bin/python3 - <<'EOF'
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {AGENT_PORT}))
s.listen()
while True:
    c, _ = s.accept()
    c.sendall(f"{{socket.gethostname()}} {{os.getpid()}}\\n".encode())
    c.close()
EOF
"""


@pytest.fixture
def control(sbx: Sandbox) -> Iterator[ControlClient]:
    with ControlClient(sbx.control.url) as client:
        yield client


# --- the world and its backend ------------------------------------------------------------

def test_a_hung_sshd_reaches_the_box_holds_across_a_stop_and_heals(
        sbx: Sandbox, control: ControlClient, backend: Any, booted: Boot) -> None:
    box = control.create_instances("vast", 1)[0]["box_id"]
    booted(sbx.world)
    assert control.fault("sshd_hang", box)["applied"][0]["box_id"] == box
    assert control.settle()
    assert backend.ops(box) == ["start", "set_sshd_hung"]
    assert control.instances()[0]["sshd_hung"] is True
    inst = sbx.world.instances[box]
    sbx.world.stop(inst)
    sbx.world.resume(inst)
    booted(sbx.world)
    assert backend.specs[box].sshd_hung  # the box boots again with its login hung
    control.fault("sshd_heal", box)
    assert control.settle()
    assert backend.ops(box)[-1] == "set_sshd_healed"
    with pytest.raises(ValueError, match="sshd_heal: no live instance"):
        control.fault("sshd_heal", "vast")  # a heal is for a box that hangs, never queued


def test_a_queued_sshd_hang_hits_the_next_box_as_it_runs(
        sbx: Sandbox, control: ControlClient, backend: Any, booted: Boot) -> None:
    assert "queued" in control.fault("sshd_hang", "runpod")
    box = control.create_instances("runpod", 1)[0]["box_id"]
    booted(sbx.world)
    assert control.settle()
    assert backend.ops(box) == ["start", "set_sshd_hung"] and control.faults() == []


def test_a_cut_ssh_path_reaches_the_providers_boxes_and_those_that_start_later(
        sbx: Sandbox, control: ControlClient, backend: Any, booted: Boot) -> None:
    vast = [r["box_id"] for r in control.create_instances("vast", 2)]
    pod = control.create_instances("runpod", 1)[0]["box_id"]
    booted(sbx.world)
    assert sorted(control.fault("ssh_path_cut", "vast")["applied"]) == sorted(vast)
    assert control.settle() and control.health()["ssh_path_cut"] == ["vast"]
    assert [backend.ops(b) for b in vast] == [["start", "set_ssh_cut"]] * 2
    assert backend.ops(pod) == ["start"]
    later = control.create_instances("vast", 1)[0]["box_id"]
    booted(sbx.world)
    assert backend.specs[later].ssh_cut and not backend.specs[pod].ssh_cut
    assert {r["box_id"]: r["ssh_path_cut"] for r in control.instances()}[later] is True
    control.fault("ssh_path_restore", "vast")
    assert control.settle() and control.health()["ssh_path_cut"] == []
    assert {backend.ops(b)[-1] for b in [*vast, later]} == {"set_ssh_restored"}
    with pytest.raises(ValueError, match="the SSH path is a provider's"):
        control.fault("ssh_path_cut", vast[0])


# --- real boxes -----------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture(scope="module")
def own_network() -> Iterator[None]:
    """This module in a network namespace of its own: the world's boxes need 10.77.0.0/16,
    which a sandbox up on this machine may hold. What starts meanwhile (the servers, the
    forwarder, `ssh`) is in it too; the tests after it are back on the machine's."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if _libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) needs root")
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        yield
    finally:
        back = _libc.setns(home, CLONE_NEWNET)
        os.close(home)
        if back != 0:
            raise OSError(ctypes.get_errno(), "setns: could not return to the machine's network")


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@pytest.fixture(scope="module")
def cloud(own_network: None, tmp_path_factory: pytest.TempPathFactory,
          key: Path) -> Iterator[Sandbox]:
    """A sandbox whose boxes are real: two Vast boxes and a RunPod one, each running the stand-in
    agent, up for the whole module (each test leaves them as it found them)."""
    state = tmp_path_factory.mktemp("boxes")
    backend = NamespaceBackend(state, bridge="flssh0", subnet="10.77.0.0/16")
    sandbox = Sandbox(seed=5, backend=backend, boot_delay=0.0, ticker=False, poll_interval=0.01)
    try:
        world = sandbox.world
        for provider in ("vast", "runpod"):
            world.ssh_keys[provider].append(key.with_suffix(".pub").read_text().strip())
        made = world.create_many("vast", 2, label_prefix="v", tcp_ports=[22, AGENT_PORT]) + \
            world.create_many("runpod", 1, label_prefix="r", tcp_ports=[22, AGENT_PORT])
        boot(world, made)
        yield sandbox
    finally:
        sandbox.close()
        sweep(state)


def boot(world: World, boxes: list[Instance]) -> None:
    with world.lock:
        for inst in boxes:
            # a pod's dockerArgs replace the image's command: the agent runs beside /start.sh
            runpod = inst.provider == "runpod"
            inst.start_hook = f"(\n{AGENT}) &\nexec /start.sh" if runpod else AGENT
    world.tick()
    assert world.settle(120)
    assert [i.phase for i in boxes] == ["running"] * len(boxes)


def namespaces(cloud: Sandbox) -> NamespaceBackend:
    backend = cloud.world.backend
    assert isinstance(backend, NamespaceBackend)
    return backend


def box(cloud: Sandbox, label: str) -> Instance:
    return next(i for i in cloud.world.instances.values() if i.label == label)


def host_data(cloud: Sandbox, key: Path, inst: Instance) -> dict[str, Any]:
    """The inventory host data of a box, as the fleet's reads take it, its host key pinned."""
    ep = inst.endpoints
    assert ep is not None and ep.host_key
    known = key.with_name(f"known-{inst.key}")
    known.write_text(f"[{ep.ssh_host}]:{ep.ssh_port} {ep.host_key}\n")
    return {"ssh_hostname": ep.ssh_host, "ssh_port": ep.ssh_port, "ssh_user": "root",
            "ssh_key": str(key), "ssh_known_hosts_file": str(known),
            "ssh_strict_host_key_checking": "yes", "host_key": ep.host_key}


def ssh_runs(cloud: Sandbox, key: Path, inst: Instance) -> bool:
    argv = boxssh.host_argv(host_data(cloud, key, inst), "true")
    return subprocess.run(argv, capture_output=True, timeout=120).returncode == 0


class Touch(FactBase[list[str]]):
    """Touches a file on the box (`read_fact` hands it as the root): what ran shows on disk."""

    def command(self, root: str) -> str:
        return f"touch {root} && echo touched"

    def process(self, output: list[str]) -> list[str]:
        return output


def touched(cloud: Sandbox, inst: Instance, name: str) -> bool:
    """Whether /root/`name` is on the box's disk (its root's upper layer), seen from here."""
    paths = BoxPaths.of(namespaces(cloud).state_dir, inst.key)
    return (paths.upper / "root" / name).exists()


def agent_says(host: str, port: int, inside: int | None = None) -> str:
    """What the agent listening at host:port answers, asked from this machine or from inside
    the network of the box whose init is `inside` (the way box-to-box traffic goes)."""
    ask = (f"import socket; s = socket.create_connection(({host!r}, {port}), timeout=10); "
           "print(s.makefile().readline().strip())")
    argv = [sys.executable, "-c", ask]
    if inside is not None:
        argv = ["nsenter", "-t", str(inside), "-n", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def agent_of(inst: Instance, inside: int | None = None) -> str:
    assert inst.endpoints is not None
    return agent_says(inst.endpoints.public_ip, inst.endpoints.ports[AGENT_PORT], inside)


def box_commands(init: int) -> list[str]:
    """The command lines of every process of a box (its init's descendants), seen from here."""
    found, todo = [], [init]
    while todo:
        pid = todo.pop()
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            todo += map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        except OSError:
            continue  # gone meanwhile
    return found


def logins(cloud: Sandbox, inst: Instance) -> int:
    """How many key logins the box's sshd has logged."""
    log = BoxPaths.of(namespaces(cloud).state_dir, inst.key).log / "sshd.log"
    return log.read_text(errors="replace").count("Accepted publickey for root")


def wait_for(what: str, check: Callable[[], bool], within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within:g}s: {what}"
        time.sleep(0.1)


def test_a_hung_sshd_logs_in_but_never_runs_the_command_while_the_box_runs_on(
        cloud: Sandbox, key: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = box(cloud, "r-0000")
    data = host_data(cloud, key, pod)
    agent = agent_of(pod)
    before = boxssh.read_fact(data, Touch(), "/root/before", 60)
    assert before.answered and before.value == ["touched"] and touched(cloud, pod, "before")
    # the read left the box's master connection: a hung login reaches its next session too
    cloud.world.inject("sshd_hang", pod.key)
    try:
        assert cloud.world.settle(60)
        seen = logins(cloud, pod)
        with monkeypatch.context() as m:
            m.setattr(boxssh, "CONNECT_TIMEOUT_S", 5)
            m.setattr(boxssh, "LOGIN_S", 1)
            hung = boxssh.read_fact(data, Touch(), "/root/hung", 1)
        assert not hung.answered and hung.value is None, hung
        assert "did not start" in (hung.error or ""), hung
        wait_for("the hung session's login in sshd's log", lambda: logins(cloud, pod) > seen)
        assert not touched(cloud, pod, "hung")
        assert agent_of(pod) == agent  # the same agent process answers: the box ran on
        init = namespaces(cloud).init_pid(pod.key)
        assert init is not None
        wait_for("the hung session to end with its connection",
                 lambda: not any(HUNG_LOGIN in c for c in box_commands(init)))
    finally:
        cloud.world.inject("sshd_heal", pod.key)
        assert cloud.world.settle(60)
    after = boxssh.read_fact(data, Touch(), "/root/after", 60)
    assert after.answered and touched(cloud, pod, "after") and not touched(cloud, pod, "hung")


def test_a_cut_ssh_path_fails_the_providers_boxes_while_they_and_their_mesh_run_on(
        cloud: Sandbox, key: Path) -> None:
    first, second, pod = box(cloud, "v-0000"), box(cloud, "v-0001"), box(cloud, "r-0000")
    assert ssh_runs(cloud, key, first) and ssh_runs(cloud, key, pod)
    cloud.world.inject("ssh_path_cut", "vast")
    try:
        assert cloud.world.settle(60)
        assert not ssh_runs(cloud, key, first) and not ssh_runs(cloud, key, second)
        assert ssh_runs(cloud, key, pod)  # the other provider's path is its own
        listed = httpx.get(f"{cloud.vast.url}/api/v1/instances/", timeout=30, headers={
            "Authorization": f"Bearer {cloud.keys.vast}"}).json()["instances"]
        assert {r["label"]: r["actual_status"] for r in listed} == {
            "v-0000": "running", "v-0001": "running"}
        # box to box, through the boxes' public ports as their mesh goes, both ways
        first_init = namespaces(cloud).init_pid(first.key)
        pod_init = namespaces(cloud).init_pid(pod.key)
        assert agent_of(second, inside=first_init).startswith(f"C.{second.id} ")
        assert agent_of(first, inside=pod_init).startswith(f"C.{first.id} ")
        later = cloud.world.create_many("vast", 1, label_prefix="late",
                                        tcp_ports=[22, AGENT_PORT])
        boot(cloud.world, later)
        assert not ssh_runs(cloud, key, later[0])  # a box that starts meanwhile is cut too
    finally:
        cloud.world.inject("ssh_path_restore", "vast")
        assert cloud.world.settle(60)
    assert all(ssh_runs(cloud, key, inst) for inst in (first, second, later[0]))
