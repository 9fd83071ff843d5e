"""A box's status reads over one SSH connection (OpenSSH's control master, `fleet.boxes.sshmux`),
against a real sshd on loopback: reused, given up when the box goes silent, closed when the
fleet stops trusting the key it was made under."""

from __future__ import annotations

import os
import signal
import socket as socketlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback_sshd import Sshd, signal_all, wait_until

from facts.box import AgentStatus
from fleet.boxes import boxssh, muxclient, sshmux
from fleet.boxes.sshkeys import write_known_hosts
from fleet.core.boxes import Row
from sandbox.boxes.proc import comm


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    s = Sshd(tmp_path)
    made: list[str] = []
    s.made = made  # type: ignore[attr-defined]
    try:
        yield s
    finally:
        listener = [s.server.proc.pid] if s.server and s.server.proc else []
        signal_all([*listener, *s.sessions()], signal.SIGCONT)
        for socket in made:
            sshmux.close(socket)
        s.stop()


def _pinned(s: Sshd) -> dict[str, object]:
    data = s.data(host_key=s.key)
    s.made.append(s.master(data))  # type: ignore[attr-defined]
    return data


def _row(s: Sshd, key: str) -> Row:
    return Row(label="b", provider="vast", role="r", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, status="running", ssh_host="127.0.0.1",
               ssh_port=s.port, host_key=key)


def test_a_second_read_of_a_box_reuses_its_connection(sshd: Sshd) -> None:
    sshd.start()
    data = _pinned(sshd)
    for _ in range(3):
        read = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30)
        assert read.answered and read.value == {}, read
    assert sshd.logins() == 1  # one key exchange and login, three reads
    assert sshmux.running(sshd.master(data))


def test_the_masters_socket_is_in_a_private_folder_short_enough_for_a_unix_socket(
        sshd: Sshd, tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90) / "known_hosts"  # next to it, a socket's path is too long
    deep.parent.mkdir()
    socket = sshmux.path(str(deep), "root", "127.0.0.1", 22, "ssh-ed25519 AAAA")
    assert socket is not None and len(socket) + 17 <= 107
    folder = Path(socket).parent
    assert folder.stat().st_mode & 0o777 == 0o700 and folder.stat().st_uid == 0
    near = sshmux.path(str(tmp_path / "kh"), "root", "127.0.0.1", 22, "ssh-ed25519 AAAA")
    assert near != socket  # another fleet's known_hosts: another master


def test_a_box_gone_silent_after_its_master_was_made_is_not_read_well(
        sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sshmux, "ALIVE_S", 1)
    monkeypatch.setattr(sshmux, "ALIVE_COUNT", 2)
    monkeypatch.setattr(boxssh, "CONNECT_TIMEOUT_S", 2)
    monkeypatch.setattr(boxssh, "LOGIN_S", 1)
    sshd.start()
    data = _pinned(sshd)
    assert boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 1).answered
    assert sshmux.running(sshd.master(data))
    # the box freezes (a host gone, packets dropped): its sshd and every session stop
    pids = [sshd.server.proc.pid, *sshd.sessions()]  # type: ignore[union-attr]
    signal_all(pids, signal.SIGSTOP)
    read = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 1)
    assert not read.answered and read.value is None and not read.late, read
    signal_all(pids, signal.SIGCONT)


def test_a_killed_box_is_not_read_well_through_its_old_master(sshd: Sshd) -> None:
    sshd.start()
    data = _pinned(sshd)
    assert boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30).answered
    assert sshmux.running(sshd.master(data))
    signal_all(sshd.sessions(), signal.SIGKILL)
    sshd.stop()
    read = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30)
    assert not read.answered and read.value is None, read


def test_a_changed_host_key_is_refused_once_the_fleet_pins_anew(sshd: Sshd) -> None:
    sshd.start()
    data = _pinned(sshd)
    old_key, known = sshd.key, Path(str(data["ssh_known_hosts_file"]))
    write_known_hosts(known, [_row(sshd, old_key)])
    assert boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30).answered
    socket = sshd.master(data)
    assert sshmux.running(socket)
    # the box's sshd comes back with another host key, on the same port; the old session lives
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(sshd.tmp / "host2")], check=True)
    sshd.server.stop()  # type: ignore[union-attr]
    sshd.start(host_key="host2", port=sshd.port)
    new_key = sshd.key
    assert new_key != old_key
    known.write_text(f"[127.0.0.1]:{sshd.port} {old_key}\n")  # the fleet still pins the old
    # the fleet forgets the box, then pins its old key again: the master made under it is gone
    write_known_hosts(known, [])
    assert not sshmux.running(socket)
    write_known_hosts(known, [_row(sshd, old_key)])
    read = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30)
    assert not read.answered and "host key" in (read.error or "").lower(), read
    # pinned anew to the key it holds: read again, over a master of that key's own
    write_known_hosts(known, [_row(sshd, new_key)])
    renewed = sshd.data(host_key=new_key)
    sshd.made.append(sshd.master(renewed))  # type: ignore[attr-defined]
    assert boxssh.read_fact(renewed, AgentStatus(), "/no-fleet-here", 30).answered
    assert sshd.master(renewed) != socket


class Sleep:
    """A command that outlives its read's deadline."""

    def command(self, root: str) -> str:
        return "sleep 60"

    def process(self, output: list[str]) -> list[str]:
        return output


def test_a_read_past_its_deadline_closes_the_master_and_its_session(sshd: Sshd) -> None:
    sshd.start()
    data = _pinned(sshd)
    assert boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30).answered
    socket = sshd.master(data)
    read = boxssh.read_fact(data, Sleep(), "/", 1)
    assert read.answered and read.late, read
    # as a fresh connection's did, the session goes with its connection: nothing runs on
    assert not sshmux.running(socket)
    wait_until("the box's sleep to end with the connection",
               lambda: not any(comm(p) == "sleep" for p in sshd.sessions()))


def test_a_read_over_a_warm_master_starts_no_ssh_client(sshd: Sshd,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sshd.start()
    data = _pinned(sshd)
    started: list[list[str]] = []
    real = subprocess.Popen

    def counted(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        started.append(argv)
        return real(argv, **kw)

    monkeypatch.setattr(boxssh.subprocess, "Popen", counted)
    assert boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30).value == {}
    assert len(started) == 1  # the first read starts `ssh`, which makes the master
    for _ in range(2):
        read = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30)
        assert read.answered and read.value == {}, read
    assert len(started) == 1 and sshd.logins() == 1


def test_a_master_killed_outright_leaves_a_stale_socket_that_reads_get_past(sshd: Sshd) -> None:
    sshd.start()
    data = _pinned(sshd)
    assert boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30).answered
    socket = sshd.master(data)
    said = subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "check", "x"],
                          capture_output=True, text=True).stderr
    os.kill(int(said.split("pid=")[1].split(")")[0]), signal.SIGKILL)
    assert Path(socket).exists() and not sshmux.running(socket)  # nothing answers there
    read = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30)
    assert read.answered and read.value == {}, read  # by `ssh`, which makes a new master
    assert sshmux.running(socket) and sshd.logins() == 2


def test_a_master_that_never_answers_is_not_read_well_and_is_put_aside(
        sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(muxclient, "HELLO_S", 0.5)
    monkeypatch.setattr(sshmux, "CLOSE_S", 1.0)
    monkeypatch.setattr(boxssh, "CONNECT_TIMEOUT_S", 2)
    monkeypatch.setattr(boxssh, "LOGIN_S", 1)
    sshd.start()
    data = _pinned(sshd)
    path = sshd.master(data)
    with socketlib.socket(socketlib.AF_UNIX) as hung:  # listens, never says a word
        hung.bind(path)
        hung.listen()
        read = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 1)
        assert not read.answered and read.value is None, read
        assert not Path(path).exists()  # unlinked: no read goes to it again
    again = boxssh.read_fact(data, AgentStatus(), "/no-fleet-here", 30)
    assert again.answered and again.value == {} and sshmux.running(path), again
