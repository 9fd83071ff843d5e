"""What OpenSSH's sshd needs to start, made in one place for the boxes and the host alike.

Debian's sshd refuses to start without its privilege separation directory ("Missing privilege
separation directory: /run/sshd"). Debian's ssh service makes it (the unit's
RuntimeDirectory), so it is there only on a machine where that service once ran since boot;
installing the package does not make it. What sshd needs is listed here once: a box's init
makes `RUN_DIRS` on the box's fresh /run (its config names them), and an sshd run on the
operator's own machine (`HostSshd`, the tests' loopback server) calls `prepare()` first.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from sandbox.boxes.errors import BoxError
from sandbox.boxes.host import SSHD

PRIVSEP_DIR = "/run/sshd"
RUN_DIRS = (PRIVSEP_DIR,)  # made root-owned, 0755, on a fresh /run before sshd starts
LOG_TAIL = 2000  # characters of sshd's own log quoted in an error


def prepare(root: str = "/") -> None:
    """Make sshd's runtime directories under `root`: root's own, 0755, as sshd insists."""
    for path in RUN_DIRS:
        target = os.path.join(root, path.lstrip("/"))
        os.makedirs(target, mode=0o755, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(target, 0, 0, follow_symlinks=False)
        os.chmod(target, 0o755)  # an umask never weakens it, an old one is made strict


class HostSshd:
    """An sshd on this machine's loopback, started from a config's lines.

    `start` returns once it listens, or raises at once with sshd's own words when it exits
    first: a test never waits out a deadline in silence to fail later on something else.
    """

    def __init__(self, workdir: Path, config: list[str], port: int) -> None:
        self.workdir, self.config, self.port = workdir, config, port
        self.log = workdir / "sshd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        prepare()
        path = self.workdir / "sshd_config"
        # its pid file in its own folder unless the config names one: never the host's
        path.write_text("\n".join([f"Port {self.port}", "ListenAddress 127.0.0.1",
                                   f"PidFile {self.workdir / 'sshd.pid'}", *self.config]) + "\n")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(path)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while True:  # bounded: until it listens, exits or the deadline passes
            if self.proc.poll() is not None:
                self.proc = None
                raise BoxError(f"sshd on 127.0.0.1:{self.port} exited before it listened: "
                               f"{self.tail()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0 and self.proc.poll() is None:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise BoxError(f"sshd on 127.0.0.1:{self.port} did not listen within "
                               f"{timeout:g}s: {self.tail()}")
            time.sleep(0.05)

    def tail(self) -> str:
        text = self.log.read_text(errors="replace").strip() if self.log.exists() else ""
        return text[-LOG_TAIL:] or "(it wrote nothing)"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None
