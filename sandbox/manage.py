"""What `fleet sandbox up|down|status|fault` do: start, stop and query the background daemon.

State directory (default `.sandbox/` in the repository):

    daemon.json   pid, ports and URLs of the running daemon (the daemon keeps it true)
    keys.json     the sandbox's API keys and the store's token (0600)
    env           export lines for `set -a; . .sandbox/env` (0600)
    daemon.log    the daemon's log
    hub/          the store's repositories and objects (kept across restarts)
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from sandbox.control_client import ControlClient
from sandbox.daemon import Keys, env_vars, write_private
from sandbox.hub import FAULT_KINDS as STORE_FAULTS

ENV_FILE = "env"
INFO_FILE = "daemon.json"
LOG_FILE = "daemon.log"


class SandboxError(RuntimeError):
    """The sandbox daemon could not be started, reached or stopped."""


def _info(state_dir: Path) -> dict[str, Any] | None:
    """daemon.json when its process is alive and is our daemon; None otherwise."""
    try:
        info: dict[str, Any] = json.loads((state_dir / INFO_FILE).read_text())
        cmdline = psutil.Process(int(info["pid"])).cmdline()
    except (OSError, ValueError, KeyError, psutil.Error):
        return None
    if "sandbox" not in cmdline or "serve" not in cmdline:
        return None  # a stale file whose pid now belongs to something else
    return info


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def env_lines(info: dict[str, Any], keys: Keys, path: Path) -> str:
    values = env_vars(info, keys)
    head = f"# fleet sandbox (pid {info['pid']}); load with: set -a; . {path}\n"
    return head + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


def up(state_dir: Path, seed: int = 0, backend: str = "null", boot_delay: float = 1.0,
       machines_per_provider: int = 16, timeout: float = 30.0) -> dict[str, Any]:
    """Start the daemon detached (or find it running), wait until healthy, write `env`."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    info = _info(state_dir)
    started = False
    if info is None:
        (state_dir / INFO_FILE).unlink(missing_ok=True)
        info = _spawn(state_dir, seed, backend, boot_delay, machines_per_provider, timeout)
        started = True
    keys = Keys.load_or_create(state_dir / "keys.json")
    write_private(state_dir / ENV_FILE, env_lines(info, keys, state_dir / ENV_FILE))
    return {**info, "started": started, "env_file": str(state_dir / ENV_FILE)}


def _spawn(state_dir: Path, seed: int, backend: str, boot_delay: float,
           machines: int, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "sandbox", "serve", "--dir", str(state_dir), "--seed",
           str(seed), "--backend", backend, "--boot-delay", str(boot_delay),
           "--machines", str(machines)]
    with open(state_dir / LOG_FILE, "ab") as log:
        since = log.tell()  # an earlier run's lines are not this one's words
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)  # outlives the CLI that started it
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SandboxError(f"sandbox daemon exited with status {proc.returncode}: "
                               f"{_log_tail(state_dir, since)} (whole log: "
                               f"{state_dir / LOG_FILE})")
        info = _info(state_dir)
        if info is not None and info["pid"] == proc.pid and _healthy(info["control_url"]):
            return info
        time.sleep(0.05)
    _terminate(proc.pid)
    raise SandboxError(f"sandbox daemon not healthy after {timeout:g}s: "
                       f"{_log_tail(state_dir, since)} (whole log: {state_dir / LOG_FILE})")


def _log_tail(state_dir: Path, since: int, lines: int = 5) -> str:
    """The daemon's last words since byte `since`, so its own error is in the message."""
    try:
        with open(state_dir / LOG_FILE, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace").strip()
    except OSError:
        text = ""
    return " | ".join(text.splitlines()[-lines:]) or "(its log is empty)"


def _terminate(pid: int, timeout: float = 60.0) -> bool:
    """SIGTERM (the daemon destroys its boxes), then SIGKILL after `timeout`; True when gone."""
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def down(state_dir: Path) -> dict[str, Any]:
    """Stop the daemon (it closes its backend, destroying every box) and remove `env`."""
    state_dir = state_dir.resolve()
    info = _info(state_dir)
    stopped = info is not None and _terminate(int(info["pid"]))
    if (state_dir / "boxes").exists():
        # a daemon that crashed could not destroy its boxes: sweep whatever is left
        from sandbox.boxes.cleanup import sweep

        sweep(state_dir / "boxes")
    for name in (INFO_FILE, ENV_FILE):
        (state_dir / name).unlink(missing_ok=True)
    return {"stopped": stopped, "pid": info["pid"] if info else None}


def status(state_dir: Path) -> dict[str, Any]:
    """Whether the daemon runs, where, and what the world holds."""
    state_dir = state_dir.resolve()
    info = _info(state_dir)
    if info is None:
        return {"running": False, "state_dir": str(state_dir)}
    out: dict[str, Any] = {"running": True, "state_dir": str(state_dir), **info,
                           "env_file": str(state_dir / ENV_FILE)}
    try:
        with ControlClient(info["control_url"], timeout=5.0) as control:
            health = control.health()
            ledger = control.ledger(events=False)
        out.update(instances=health["instances"], machines=health["machines"],
                   usd_per_hour=ledger["usd_per_hour"], total_usd=ledger["total_usd"])
    except (httpx.HTTPError, ValueError) as exc:
        out["healthy"] = False
        out["error"] = str(exc)
    else:
        out["healthy"] = True
    return out


def fault(state_dir: Path, kind: str, target: str, count: int = 1,
          **params: Any) -> dict[str, Any]:
    """Inject a fault into the running sandbox (see sandbox.control for kinds and targets; the
    store's kinds, `sandbox.hub.faults`, take a repository or `*` as target)."""
    info = _info(state_dir.resolve())
    if info is None:
        raise SandboxError("the sandbox is not running; start it with `fleet sandbox up`")
    if kind in STORE_FAULTS:
        return _store_fault(state_dir.resolve(), info, kind, target, count)
    with ControlClient(info["control_url"]) as control:
        try:
            return control.fault(kind, target, count, **params)
        except ValueError as exc:
            raise SandboxError(str(exc)) from exc


def _store_fault(state_dir: Path, info: dict[str, Any], kind: str, target: str,
                 count: int) -> dict[str, Any]:
    """Arm a fault on the store's own control route (it wants the store's token)."""
    if not info.get("hub_url"):
        raise SandboxError("this sandbox runs no store; restart it (`fleet sandbox down`, "
                           "then `fleet sandbox up`)")
    keys = Keys.load_or_create(state_dir / "keys.json")
    body = {"kind": kind, "count": count, "repo": None if target in ("", "*") else target}
    try:
        resp = httpx.post(f"{info['hub_url']}/_sandbox/faults", json=body, timeout=10.0,
                          headers={"Authorization": f"Bearer {keys.hub}"})
    except httpx.HTTPError as exc:
        raise SandboxError(f"sandbox store unreachable: {exc}") from exc
    if resp.status_code >= 400:
        raise SandboxError(f"sandbox store fault: {resp.json().get('error')}")
    answer: dict[str, Any] = resp.json()
    return answer


def load_env(state_dir: Path) -> dict[str, str]:
    """The variables `env` exports, as a dict (for subprocesses and tests)."""
    out: dict[str, str] = {}
    for line in (state_dir / ENV_FILE).read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[7:].partition("=")
            out[name] = "".join(shlex.split(value))
    return out


__all__ = ["SandboxError", "up", "down", "status", "fault", "load_env"]
