"""`python -m agent switch --node PATH --sha256 HEX`: one box's part of a publish.

Writes the pointer (digest file first, each by rename), asks the agent to look at it now
(SIGUSR2: the next tick comes at once), then waits until the node runs the new
digest (read back from /proc) and its own RPC reports synced continuously for `stable_s`,
within `deadline_s` of the pointer write. The agent does the switch itself (stop the old node,
then start the new one); this command only points and watches. Not healthy by the deadline:
the previous pointer goes back and the command waits until the previous digest runs again
(read back too). Exit 0 switched or unchanged, 3 reverted, 4 failed (could not even revert),
1 refused (the file is missing or does not match: nothing changed), 5 superseded.

Two switches never interleave: each holds run/switch.lock for its whole life (a second one waits
for the first to end, at most LOCK_WAIT_S: then it is refused and changes nothing). And a revert
never undoes a newer pointer: the previous pointer goes back only while the pointer still holds
what this command wrote; a pointer someone else wrote meanwhile is left alone (`superseded`).
"""

from __future__ import annotations

import os
import signal
import time

from agent.base import releases_record
from agent.base.config import Config
from agent.base.files import DigestCache, atomic_write
from agent.base.lock import AgentLock
from agent.base.pointer import read_pointer
from agent.commands.readback import readback
from agent.commands.stop import live_agent
from agent.contract import (
    NODE,
    SWITCH_EXIT,
    SWITCH_LOCK_WAIT_S,
    Layout,
    PointerDoc,
    SwitchDoc,
    SwitchOutcome,
)

POLL_S = 0.25
LOCK_WAIT_S = SWITCH_LOCK_WAIT_S  # a switch waits this long for another to end


def write_pointer(layout: Layout, target: str, sha256: str) -> None:
    """The digest first, then the path, each replaced atomically and durably: the agent never
    sees a path without its digest."""
    atomic_write(layout.pointer_digest, sha256 + "\n", durable=True)
    atomic_write(layout.pointer, target + "\n", durable=True)


def switch(cfg: Config, target: str, sha256: str, stable_s: float, deadline_s: float
           ) -> tuple[SwitchDoc, int]:
    layout = cfg.layout
    layout.run.mkdir(parents=True, exist_ok=True)
    lock = AgentLock(layout.switch_lock)
    if not lock.acquire_within(LOCK_WAIT_S, POLL_S):
        reason = (f"another switch has held run/switch.lock for {LOCK_WAIT_S:.0f} s; nothing "
                  "changed (try again once it has ended)")
        return {"outcome": SwitchOutcome.REFUSED, "reason": reason, "previous": None,
                "target": {"target": target, "sha256": sha256}}, \
            SWITCH_EXIT[SwitchOutcome.REFUSED]
    try:
        return _switch(cfg, target, sha256, stable_s, deadline_s)
    finally:
        lock.release()


def _switch(cfg: Config, target: str, sha256: str, stable_s: float, deadline_s: float
            ) -> tuple[SwitchDoc, int]:
    layout = cfg.layout
    digests = DigestCache()  # one for the whole wait: each file hashed once per change
    wanted: PointerDoc = {"target": target, "sha256": sha256}
    current = read_pointer(layout)
    previous: PointerDoc | None = ({"target": current.target, "sha256": current.digest_text}
                                   if current is not None else None)

    def result(outcome: SwitchOutcome, reason: str | None) -> tuple[SwitchDoc, int]:
        return ({"outcome": outcome, "reason": reason, "previous": previous, "target": wanted,
                 "readback": readback(cfg, digests)}, SWITCH_EXIT[outcome])

    refusal = _check_file(target, sha256)
    if refusal:
        return result(SwitchOutcome.REFUSED, refusal)
    pointed = previous == wanted
    if pointed and _healthy(cfg, sha256, digests):
        return result(SwitchOutcome.UNCHANGED, None)
    if not pointed:
        if previous is not None:
            releases_record.record(layout, previous, wanted)
        write_pointer(layout, target, sha256)
        _nudge(cfg)
    deadline = time.monotonic() + deadline_s
    if _wait_healthy(cfg, sha256, stable_s, deadline, digests):
        return result(SwitchOutcome.SWITCHED, None)
    why = (f"the node did not run {sha256[:16]} synced for {stable_s:.0f} s within "
           f"{deadline_s:.0f} s")
    if previous is None or pointed:
        return result(SwitchOutcome.FAILED, f"{why}; no earlier pointer to go back to")
    now = read_pointer(layout)
    if now is None or (now.target, now.digest_text) != (target, sha256):
        newer = f"{now.target} ({now.digest_text[:16]})" if now else "nothing"
        return result(SwitchOutcome.SUPERSEDED, f"{why}; not reverted: the pointer now names "
                      f"{newer}, written by someone else meanwhile")
    releases_record.record(layout, wanted, previous)
    write_pointer(layout, previous["target"], previous["sha256"])
    _nudge(cfg)
    if _wait_running(cfg, previous["sha256"], time.monotonic() + deadline_s, digests):
        return result(SwitchOutcome.REVERTED, f"{why}; reverted to {previous['sha256'][:16]}")
    return result(SwitchOutcome.FAILED, f"{why}; the revert to {previous['sha256'][:16]} did "
                  f"not come back within {deadline_s:.0f} s")


def _nudge(cfg: Config) -> None:
    """Ask the live agent to look at the pointer now (SIGUSR2) rather than at its next tick;
    without an agent (or if the signal is lost) the next tick takes it anyway."""
    pid = live_agent(cfg)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGUSR2)
        except OSError:
            pass


def _check_file(target: str, sha256: str) -> str | None:
    if not os.path.isabs(target):
        return f"{target!r} is not an absolute path"
    try:  # one open: what is checked is what is hashed (a FIFO or a device is refused)
        actual, st = DigestCache().digest(target)
    except OSError as e:
        return f"{target} cannot be read: {e.strerror or e}"
    if not st.st_mode & 0o111:
        return f"{target} is not an executable file"
    if actual != sha256:
        return f"{target} has sha256 {actual[:16]}..., the release says {sha256[:16]}..."
    return None


def _healthy(cfg: Config, sha256: str, digests: DigestCache) -> bool:
    node = readback(cfg, digests).get(NODE)
    return node is not None and node.get("sha256") == sha256 and node.get("synced") is True


def _wait_healthy(cfg: Config, sha256: str, stable_s: float, deadline: float,
                  digests: DigestCache) -> bool:
    since: float | None = None
    while time.monotonic() < deadline:
        now = time.monotonic()
        if _healthy(cfg, sha256, digests):
            since = now if since is None else since
            if now - since >= stable_s:
                return True
        else:
            since = None
        time.sleep(POLL_S)
    return False


def _wait_running(cfg: Config, sha256: str, deadline: float, digests: DigestCache) -> bool:
    while time.monotonic() < deadline:
        node = readback(cfg, digests).get(NODE)
        if node is not None and node.get("sha256") == sha256 and node.get("version") is not None:
            return True
        time.sleep(POLL_S)
    return False
