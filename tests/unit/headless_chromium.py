"""A real headless Chromium (Debian's `chromium`) driven over the DevTools protocol.

The protocol runs over `--remote-debugging-pipe`: Chromium reads commands from fd 3 and writes
answers and events to fd 4, one JSON message per NUL-terminated chunk. No websocket, no port,
standard library only. Every wait is a bounded poll on the pipe (select with a deadline), never a
fixed sleep.

Example:

    with Chromium(tmp_path) as c:
        c.open(page.as_uri())
        rows = c.evaluate("document.querySelectorAll('tr').length")
        c.screenshot(tmp_path / "page.png")
        assert c.requests() == [page.as_uri()] and c.console() == []
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

TIMEOUT = 180.0  # generous: Chromium under a fully loaded machine is slow


class ChromiumError(Exception):
    pass


def executable() -> str | None:
    return shutil.which("chromium")


class Chromium:
    def __init__(self, workdir: Path, width: int = 1280, height: int = 900,
                 timeout: float = TIMEOUT) -> None:
        self.workdir = workdir
        self.width, self.height = width, height
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._buf = b""
        self._next_id = 0
        self._session: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------ start and stop

    def __enter__(self) -> Chromium:
        exe = executable()
        if exe is None:
            raise ChromiumError("chromium is not installed (Debian's `chromium` package; "
                                "./run.sh setup installs it)")
        profile = self.workdir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        # Chromium's ends go to fds 3 and 4 in the child; copies above 9 keep dup2 from
        # overwriting one with the other
        child_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(res_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(cmd_r)
        os.close(res_w)

        def to_3_and_4() -> None:  # dup2 leaves the new fds inheritable
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        self._log = open(self.workdir / "chromium.log", "wb")  # noqa: SIM115
        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--metrics-recording-only", "--mute-audio",
                "--hide-scrollbars", "--force-color-profile=srgb",
                # nothing leaves the machine even if a page asked: every host name fails
                "--host-resolver-rules=MAP * ~NOTFOUND",
                f"--user-data-dir={profile}", f"--window-size={self.width},{self.height}",
                "about:blank"]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=self._log, close_fds=False,
                                      preexec_fn=to_3_and_4)  # noqa: PLW1509
        os.close(child_r)
        os.close(child_w)
        self._w, self._r = cmd_w, res_r
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"},
                               browser=True)["targetId"]
            self._session = self.call("Target.attachToTarget",
                                      {"targetId": target, "flatten": True},
                                      browser=True)["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable")
            self.viewport(self.width, self.height)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        with contextlib.suppress(Exception):
            self._send("Browser.close", {}, None)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        for fd in (self._w, self._r):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()

    # ------------------------------------------------------------ the protocol

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._w, data):]
        return self._next_id

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self._r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise ChromiumError("chromium closed its pipe; see chromium.log: "
                                    + self._log_tail())
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def _log_tail(self) -> str:
        self._log.flush()
        text = (self.workdir / "chromium.log").read_text(errors="replace")
        return text[-2000:]

    def call(self, method: str, params: dict[str, Any] | None = None, *,
             browser: bool = False, timeout: float | None = None) -> dict[str, Any]:
        """Send one command (to the page, or to the browser) and return its result; events
        that arrive meanwhile are kept in `events`."""
        want = self._send(method, params or {}, None if browser else self._session)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            msg = self._read(deadline)
            if msg.get("id") == want:
                if "error" in msg:
                    raise ChromiumError(f"{method}: {msg['error']}")
                result: dict[str, Any] = msg.get("result", {})
                return result
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, since: int = 0,
                   timeout: float | None = None) -> dict[str, Any]:
        """The first event `method` at or after index `since` of `events`, waiting for it."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for e in self.events[since:]:
                if e.get("method") == method:
                    return e
            msg = self._read(deadline)
            if "method" in msg:
                self.events.append(msg)

    # ------------------------------------------------------------ what the tests use

    def viewport(self, width: int, height: int) -> None:
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1,
                   "mobile": False})

    def open(self, url: str) -> None:
        """Navigate and wait for the load event (every subresource loaded or failed)."""
        mark = len(self.events)
        nav = self.call("Page.navigate", {"url": url})
        if nav.get("errorText"):
            raise ChromiumError(f"cannot open {url}: {nav['errorText']}")
        self.wait_event("Page.loadEventFired", since=mark)

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise ChromiumError(f"evaluate: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            m = self.call("Page.getLayoutMetrics")
            size = m.get("cssContentSize") or m["contentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": size["width"],
                                "height": size["height"], "scale": 1})
        data = self.call("Page.captureScreenshot", params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def requests(self, since: int = 0) -> list[str]:
        """Every URL asked for from event `since` on, in order (documents included)."""
        return [e["params"]["request"]["url"] for e in self.events[since:]
                if e["method"] == "Network.requestWillBeSent"]

    def console(self, since: int = 0) -> list[str]:
        """From event `since` on: every console message, uncaught exception, and error or
        warning the browser logged (a failed load, a CSP refusal), as text."""
        out = []
        for e in self.events[since:]:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", "")))
                                for a in p.get("args", []))
                out.append(f"console.{p.get('type')}: {text}")
            elif e["method"] == "Runtime.exceptionThrown":
                out.append(f"exception: {p.get('exceptionDetails', {}).get('text')}")
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] in ("error",
                                                                               "warning"):
                entry = p["entry"]
                out.append(f"log {entry['level']}: {entry.get('text')} {entry.get('url', '')}")
        return out
