"""A real fleet loop in a process of its own, for the leader's tests and its failover bench:
the loop's own code over a provider whose boxes live in a JSON file every process shares, so
that killing a loop loses nothing the provider did. Each create and destroy is also appended to
an event log, which the tests and the bench read.

    python tests/unit/leader_loop.py FOLDER DATABASE_URL MODE

FOLDER holds fleet.toml, the provider's file (`provider.json`) and its log (`events.log`).
MODE: `tick` campaigns once and runs one tick (exit 3, said, when it does not lead or lost the
lead); `lead` runs `fleet.ops.loop.lead` until killed.

Set in the environment, for the tests' kill points:
- PAUSE_IN_OFFERS=<file>: the provider's offers() blocks until <file> exists (a tick stopped
  between its last save and its rent);
- CREATE_PAUSE_S=<s>: a create sleeps up to that long after the box exists, before its id goes
  back to the loop (a kill there leaves a box whose row has no id yet).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TOML = """
[fleet]
registry = "{folder}/state/boxes.json"
ssh_key = "{folder}/state/ssh/fleet"
daily_budget_usd = 1000
[loop]
orphan_grace_s = 600
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
admitted_driver = "580.95.05"
[[roster.live]]
provider = "vast"
card = "RTX 4090"
"""


def wait_for(what: str, ok: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """`ok()`'s first true answer, polled (bounded): the tests wait on a condition, never a
    fixed sleep."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = ok()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def prepare(folder: Path) -> Path:
    """fleet.toml, an SSH key the loop can read and an empty provider in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fleet.toml").write_text(TOML.format(folder=folder))
    key = folder / "state" / "ssh" / "fleet"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("a key\n")
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAA fleet\n")
    (folder / "provider.json").write_text(json.dumps({"next": 100, "boxes": {}}))
    (folder / "events.log").write_text("")
    return folder


def events(folder: Path) -> list[dict[str, Any]]:
    """The provider's log: one {"op", "label", "id", "pid"} per create or destroy."""
    return [json.loads(line) for line in (folder / "events.log").read_text().splitlines()
            if line.strip()]


class FileVast:
    """The Vast of the unit tests' loop, its boxes kept in FOLDER/provider.json."""

    name = "vast"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """The provider's boxes under its lock, replaced whole (a process killed mid-write
        leaves the last state, as a provider would)."""
        path = self.folder / "provider.json"
        with open(self.folder / "provider.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(path.read_text())
            yield state
            tmp = path.with_name(f"provider.{os.getpid()}.tmp")
            with open(tmp, "w") as f:
                f.write(json.dumps(state))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)

    def _log(self, op: str, label: str, box_id: str) -> None:
        with open(self.folder / "events.log", "a") as f:
            f.write(json.dumps({"op": op, "label": label, "id": box_id, "pid": os.getpid()})
                    + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _box(self, d: dict[str, Any]) -> Any:
        from fleet.providers.base import Box

        return Box("vast", d["id"], d["label"], "RTX 4090", 1, 0.2, "running",
                   driver="580.95.05", ssh_host="10.0.0.1", ssh_port=22, machine_id=d["id"])

    def offers(self, card: str | None = None, gpu_count: int = 1, driver: str | None = None,
               direct_ports: int = 0, cuda: tuple[str, ...] = (),
               rocm: tuple[str, ...] = (),
               disk_gb: float | None = None) -> list[Any]:
        from fleet.providers.base import Offer

        self._log("offers", "", "")
        gate = os.environ.get("PAUSE_IN_OFFERS")
        while gate and not Path(gate).exists():
            time.sleep(0.02)
        return [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05")]

    def rent(self, offer: Any, req: Any) -> Any:
        with self._state() as s:
            box_id = str(s["next"])
            s["next"] += 1
            d = s["boxes"][box_id] = {"id": box_id, "label": req.label}
        self._log("create", req.label, box_id)
        pause = float(os.environ.get("CREATE_PAUSE_S") or 0)
        if pause:  # the box exists; the loop does not know its id yet
            time.sleep(random.uniform(0, pause))
        return self._box(d)

    def boxes(self) -> list[Any]:
        with self._state() as s:
            return [self._box(d) for d in s["boxes"].values()]

    def box(self, box_id: str) -> Any:
        with self._state() as s:
            d = s["boxes"].get(box_id)
        return None if d is None else self._box(d)

    def find_by_label(self, label: str) -> Any:
        return next((b for b in self.boxes() if b.label == label), None)

    def stop(self, box_id: str) -> None:
        raise AssertionError("the loop never stops boxes")

    def take_away(self, box_id: str) -> None:
        """The box ends on the provider's side, unasked (its machine failed)."""
        with self._state() as s:
            s["boxes"].pop(box_id, None)

    def destroy(self, box_id: str) -> None:
        with self._state() as s:
            d = s["boxes"].pop(box_id, None)
        if d is not None:
            self._log("destroy", d["label"], box_id)


def make_loop(folder: Path, fence: Any) -> Any:
    from fleet.core import config
    from fleet.core.verdicts import Health
    from fleet.ops.loop import Loop

    cfg = config.parse(tomllib.loads((folder / "fleet.toml").read_text()),
                       folder / "fleet.toml")

    vast = FileVast(folder)

    def check(_cfg: Any, built: Any) -> list[Health]:
        """SSH answers where the provider still has the box (one taken away dies)."""
        there = {b.label for b in vast.boxes()}
        return [Health(label, "vast", ssh=label in there, agent=label in there,
                       problems=[] if label in there else ["ssh: box did not answer"])
                for label, _ in built.groups["standing"]]

    return Loop(cfg, {"vast": vast}, echo=lambda line: print(line, flush=True),
                converge_fn=lambda _cfg, _labels: None, check_fn=check, fence=fence)


def main() -> int:
    folder, url, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    os.environ["FLEET_DATABASE_URL"] = url
    import fleet.ops.rent
    from fleet.core.errors import NotLeader
    from fleet.ops import loop
    from fleet.state.db import open_url
    from fleet.state.leader import Leadership

    # no SSH here: a box is ready once rented (the loop's resume pins it next tick)
    fleet.ops.rent.wait_ready = lambda *_a, **_k: {}  # type: ignore[assignment]
    leading = Leadership(open_url(url))
    if mode == "lead":
        loop.lead(leading, lambda fence: make_loop(folder, fence), 0.2, False,
                  lambda t: print(t.summary(), flush=True),
                  lambda line: print(line, flush=True), poll_s=0.1)
        return 0
    fence = leading.campaign()
    if fence is None:
        print("not leading", flush=True)
        return 3
    print(f"leading epoch {fence.epoch}", flush=True)
    try:
        make_loop(folder, fence).tick()
    except NotLeader as e:
        print(f"NotLeader: {e}", flush=True)
        return 3
    print("ticked", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
