"""The operator's reads of a box through the system's `ssh`, against a real sshd on loopback:
the host key it proves it holds, a fact read with its deadlines, and what `fleet check` makes
of a box that answers SSH but not with a status."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback_sshd import Sshd, free_port

from facts.box import AgentStatus
from fleet.boxes import boxssh
from fleet.boxes.sshkeys import fetch_host_key
from fleet.core.errors import FleetError
from sandbox.boxes.errors import BoxError
from sandbox.boxes.sshd import HostSshd, prepare


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    s = Sshd(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def test_sshds_runtime_directory_is_made_where_no_ssh_service_ran(tmp_path: Path) -> None:
    old = os.umask(0o077)  # a strict umask never makes it unusable for sshd's privsep child
    try:
        prepare(str(tmp_path))
    finally:
        os.umask(old)
    made = tmp_path / "run" / "sshd"
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o755
    prepare(str(tmp_path))  # again: nothing to do, no error


def test_an_sshd_that_cannot_start_fails_at_once_in_its_own_words(tmp_path: Path) -> None:
    server = HostSshd(tmp_path, ["NoSuchOption yes"], free_port())
    with pytest.raises(BoxError, match="exited before it listened: .*NoSuchOption"):
        server.start(timeout=600)  # had it waited for the port, this would take ten minutes
    assert server.proc is None


def test_the_host_key_is_the_one_the_server_holds(sshd: Sshd) -> None:
    sshd.start()
    want = (sshd.tmp / "host.pub").read_text().split()[:2]
    assert fetch_host_key("127.0.0.1", sshd.port, 5).split() == want
    with pytest.raises(FleetError, match="no host key"):
        fetch_host_key("127.0.0.1", free_port(), 2)
    with pytest.raises(FleetError, match="no host key"):  # never read as an ssh option
        fetch_host_key(f"-oProxyCommand=touch {sshd.tmp / 'ran'}", sshd.port, 2)
    assert not (sshd.tmp / "ran").exists()


def test_a_fact_read_answers_and_a_dead_port_does_not(sshd: Sshd) -> None:
    sshd.start()
    read = boxssh.read_fact(sshd.data(), AgentStatus(), str(sshd.tmp / "no-fleet-here"), 30)
    assert read.answered and read.value == {} and not read.late  # no agent installed
    sshd.stop()
    gone = boxssh.read_fact(sshd.data(ssh_connect_retries=1), AgentStatus(), "/x", 30)
    assert not gone.answered and not gone.late and gone.value is None


def test_a_box_that_answers_ssh_but_not_with_a_status_is_not_read_as_dead(sshd: Sshd) -> None:
    sshd.start(force_command="echo fleet-ssh-connected; echo this is not json")
    read = boxssh.read_fact(sshd.data(), AgentStatus(), "/root/fleet", 30)
    assert read.answered and read.value is None and "not JSON" in (read.error or "")


def test_a_box_whose_login_never_ends_has_not_answered(sshd: Sshd,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    logins = sshd.tmp / "logins"
    # the shell never runs the command: a hung login (each login noted, then hung)
    sshd.start(force_command=f"echo login >> {logins}; sleep 600")
    monkeypatch.setattr(boxssh, "CONNECT_TIMEOUT_S", 2)
    monkeypatch.setattr(boxssh, "LOGIN_S", 1)
    read = boxssh.read_fact(sshd.data(ssh_connect_retries=2), AgentStatus(), "/root/fleet", 1)
    # the read returned at its deadline, and a box that never runs a command is not alive
    assert not read.answered and not read.late and read.value is None, read
    assert read.connected and "did not start within 4 s" in (read.error or ""), read
    # connected: no retry helps (before: three logins, each the whole window)
    assert logins.read_text().splitlines() == ["login"]


def test_a_box_presenting_another_host_key_is_refused_in_plain_words(sshd: Sshd) -> None:
    """ssh's banner for a changed key runs to many lines, its verdict last: the read says
    the refusal plainly, so that the loop can tell it from a box that does not answer."""
    sshd.start()
    pinned = sshd.data(host_key=sshd.key)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(sshd.tmp / "new")],
                   check=True)
    sshd.start(host_key="new", port=sshd.port)  # same address, another key
    (sshd.tmp / "known").write_text(f"[127.0.0.1]:{sshd.port} {pinned['host_key']}\n")
    read = boxssh.read_fact(pinned, AgentStatus(), "/root/fleet", 30)
    assert not read.answered and read.error == boxssh.KEY_REFUSED
    assert fetch_host_key("127.0.0.1", sshd.port, 5) != pinned["host_key"]
