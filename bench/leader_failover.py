"""Two fleet loops on one PostgreSQL, the leader SIGKILLed again and again: does a takeover ever
create a label twice, put two live boxes in one roster slot, or leave a create without a row,
and how long does it take?

Each loop is `tests/unit/leader_loop.py ... lead`: the real `fleet.ops.loop.lead` and `Loop`
over a provider whose boxes live in a shared file (its creates and destroys logged), a roster
of one slot, a tick every 0.2 s, a standby polling every 0.1 s. Each create sleeps up to
`--create-pause` seconds after the box exists and before its id goes back to the loop, so a
kill lands there often. Each round picks a kill point at random: a random moment of the
leader's ticks, or (after the slot's box is destroyed by hand, as `fleet destroy` does, so the
loop rents the slot again) the moment the leader's create is logged, before the row records
its id. The
killed loop is started again as the next standby. Run as root, from the repository root:

    .venv/bin/python bench/leader_failover.py --kills 20

It prints one JSON document: the counts (each must be 0, or 1 for boxes per slot), how many
kills landed between a create and its row's id, and the takeover times (kill to the next
leader's epoch in the database).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import _smoke  # noqa: E402
import pgserver  # noqa: E402
import psycopg  # noqa: E402

from fleet.state.registry import Registry  # noqa: E402
from tests.unit import leader_loop  # noqa: E402

TIMEOUT_S = 60.0


def wait_for(what: str, ok: Callable[[], Any], timeout_s: float = TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = ok()
        if got:
            return got
        time.sleep(0.01)
    raise SystemExit(f"not within {timeout_s:.0f} s: {what}")


class Fleet:
    def __init__(self, folder: Path, url: str, create_pause: float) -> None:
        self.folder, self.url = folder, url
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "CREATE_PAUSE_S": str(create_pause)}
        self.loops: list[subprocess.Popen[bytes]] = []
        self.db = psycopg.connect(url, autocommit=True)
        self.most_per_slot = 0
        self.samples = 0

    def start_loop(self) -> None:
        log = open(self.folder / f"loop-{len(self.loops)}.log", "wb")  # noqa: SIM115
        self.loops.append(subprocess.Popen(
            [sys.executable, str(ROOT / "tests/unit/leader_loop.py"), str(self.folder),
             self.url, "lead"], stdout=log, stderr=subprocess.STDOUT, env=self.env))

    def leader(self) -> tuple[int, int] | None:
        """(epoch, pid) of the leader row, where one of the running loops holds it."""
        try:
            row = self.db.execute("SELECT epoch, holder FROM leader WHERE id = 1").fetchone()
        except psycopg.errors.UndefinedTable:
            return None
        if row is None:
            return None
        pid = int(str(row[1]).rsplit(" ", 1)[-1])
        alive = {p.pid for p in self.loops if p.poll() is None}
        return (int(row[0]), pid) if pid in alive else None

    def rows(self) -> dict[str, tuple[str | None, str | None, int]]:
        """label -> (slot, provider id, live)"""
        try:
            got = self.db.execute("SELECT label, slot, provider_id, live FROM boxes").fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
        return {str(r[0]): (r[1], r[2], int(r[3])) for r in got}

    def filled(self) -> tuple[str, str] | None:
        """(label, provider id) of the slot's live box, once its row has the id."""
        return next(((label, pid) for label, (slot, pid, live) in self.rows().items()
                     if live and slot and pid), None)

    def sample(self) -> None:
        """Live boxes per slot: the provider's boxes, each by its row's slot."""
        rows = self.rows()
        boxes = json.loads((self.folder / "provider.json").read_text())["boxes"].values()
        per = Counter(rows[b["label"]][0] for b in boxes if b["label"] in rows
                      and rows[b["label"]][0])
        self.most_per_slot = max([self.most_per_slot, *per.values()])
        self.samples += 1

    def watch(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.sample()
            time.sleep(0.02)

    def events(self) -> list[dict[str, Any]]:
        return leader_loop.events(self.folder)


def run(kills: int, create_pause: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with pgserver.running() as server:
        name = pgserver.create_database(server)
        url = server.url(name)
        os.environ["FLEET_DATABASE_URL"] = url  # the bench's own reads and its hand destroys
        folder = leader_loop.prepare(Path(tempfile.mkdtemp(prefix="failover-")))
        fleet = Fleet(folder, url, create_pause)
        fleet.start_loop()
        fleet.start_loop()
        takeovers: list[float] = []
        between = 0
        try:
            for _ in range(kills):
                epoch, pid = wait_for("a leader", fleet.leader)
                if rng.random() < 0.5:  # a random moment of its ticks
                    fleet.watch(rng.uniform(0.0, 1.5))
                else:  # its slot's box destroyed by hand; kill it as it rents the slot again
                    seen = len(fleet.events())
                    label, box_id = wait_for("a box in the slot, its id recorded", fleet.filled)
                    leader_loop.FileVast(folder).take_away(box_id)
                    Registry(folder / "state" / "boxes.json").mark_destroyed(label)

                    def created(seen: int = seen, pid: int = pid) -> Any:
                        fleet.sample()
                        return next((e for e in fleet.events()[seen:]
                                     if e["op"] == "create" and e["pid"] == pid), None)

                    made = wait_for("the leader's create", created)
                    row = fleet.rows().get(made["label"])
                    between += row is not None and row[1] is None
                killed = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                dead = next(p for p in fleet.loops if p.pid == pid)
                dead.wait()

                def taken(epoch: int = epoch) -> Any:
                    fleet.sample()
                    now = fleet.leader()
                    return now is not None and now[0] > epoch

                wait_for("a takeover", taken)
                takeovers.append(time.monotonic() - killed)
                fleet.start_loop()
            # let the last leader settle: the slot holds a box with its id recorded
            wait_for("the slot filled", fleet.filled)
            fleet.watch(1.0)
        finally:
            for p in fleet.loops:
                if p.poll() is None:
                    p.kill()
                p.wait()
        events = fleet.events()
        rows = fleet.rows()
        creates = Counter(e["label"] for e in events if e["op"] == "create")
        listed = json.loads((folder / "provider.json").read_text())["boxes"].values()
        fleet.db.close()
        pgserver.drop_database(server, name)
    return {
        "kills": kills,
        "kills_between_create_and_id": between,
        "creates": sum(creates.values()),
        "labels_created_twice": sum(1 for n in creates.values() if n > 1),
        "creates_without_a_row": sum(1 for label in creates if label not in rows),
        "boxes_listed_without_a_row_at_end": sum(1 for b in listed if b["label"] not in rows),
        "most_live_boxes_per_slot": fleet.most_per_slot,
        "samples": fleet.samples,
        "takeover_s": {"p50": round(statistics.median(takeovers), 3),
                       "max": round(max(takeovers), 3)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--create-pause", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    args = _smoke.parse(ap, kills=3)
    print(json.dumps(run(args.kills, args.create_pause, args.seed), indent=2))


if __name__ == "__main__":
    main()
