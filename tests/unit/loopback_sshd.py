"""An sshd on loopback for the tests of the operator's reads of a box: its own host key, the
client's key authorized, and the known_hosts file that pins it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopback import free_port

from fleet.boxes import sshmux
from fleet.boxes.sshkeys import fetch_host_key
from sandbox.boxes.sshd import HostSshd


class Sshd:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.key = ""  # the host key it proves it holds, as pinned
        for name in ("host", "client"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                            str(tmp / name)], check=True)
        (tmp / "authorized").write_text((tmp / "client.pub").read_text())
        self.port = 0
        self.server: HostSshd | None = None

    def start(self, force_command: str | None = None, host_key: str = "host",
              port: int | None = None) -> None:
        self.stop()
        self.port = port or free_port()
        config = [f"HostKey {self.tmp / host_key}", "UsePAM no", "StrictModes no",
                  "PermitRootLogin yes", f"AuthorizedKeysFile {self.tmp / 'authorized'}"]
        if force_command:
            config.append(f"ForceCommand {force_command}")
        self.server = HostSshd(self.tmp, config, self.port)
        self.server.start()  # raises with sshd's own words when it does not listen
        self.key = fetch_host_key("127.0.0.1", self.port, 5)
        (self.tmp / "known").write_text(f"[127.0.0.1]:{self.port} {self.key}\n")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def data(self, **extra: Any) -> dict[str, Any]:
        return {"ssh_hostname": "127.0.0.1", "ssh_port": self.port, "ssh_user": "root",
                "ssh_key": str(self.tmp / "client"),
                "ssh_known_hosts_file": str(self.tmp / "known"),
                "ssh_strict_host_key_checking": "yes", **extra}

    def sessions(self) -> list[int]:
        """The pids of the processes serving its connections (the listener's descendants)."""
        if self.server is None or self.server.proc is None:
            return []
        return _descendants(self.server.proc.pid)

    def logins(self) -> int:
        """The connections it accepted (one key exchange and login each)."""
        return (self.tmp / "sshd.log").read_text().count("Accepted publickey")

    def master(self, data: dict[str, Any]) -> str:
        """The socket of the master connection `data`'s reads go through."""
        socket = sshmux.path(str(data["ssh_known_hosts_file"]), "root", "127.0.0.1",
                             int(data["ssh_port"]), str(data["host_key"]))
        assert socket is not None, "no private folder for the master's socket"
        return socket


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        kids = [c for c, p in parents.items() if p == parent]
        found += kids
        todo += kids
    return found


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_until(what: str, check: Callable[[], bool], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"not within {within:g}s: {what}"
        time.sleep(0.1)
