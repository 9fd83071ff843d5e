"""Stale readings are never acted on: with the observer frozen on a reading that says "synced,
exec tip 0", the recipe stops running once that reading is past the freshness limit, the status
reads `healthy: null` with no figures, and the RESULT line carries `-`."""

from __future__ import annotations

import time

from agentbox import Box, wait_for

FROZEN = """
import os, time
from agent.daemon import observer
real = observer.probe_program
def probe(program, values):  # an observer stuck where no deadline reaches
    while os.path.exists(os.environ["FREEZE"]):
        time.sleep(0.05)
    return real(program, values)
observer.probe_program = probe
"""


def test_a_frozen_reading_is_unknown_and_nothing_is_decided_on_it(box: Box) -> None:
    runs = box.tmp / "recipe-runs.log"
    recipe = box.root / "in" / "box-exec-snapshot.sh"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(f"#!/bin/sh\necho run >> {runs}\n")
    recipe.chmod(0o755)
    freeze = box.tmp / "freeze"
    box.env_extra["FREEZE"] = str(freeze)
    box.set_node_state(synced=True, blocks=2000, exec_tip=0)
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(result_every_s=0.3, sections={"recovery": {
        "recipe": "{root}/in/box-exec-snapshot.sh", "min_blocks": 1000, "cooldown_s": 0.3}})
    box.start_agent(prelude=FROZEN)
    # the recipe writes its file before the tick that started it writes status.json: wait for
    # that status, or the one before it (readings taken before the programs' start) is read
    wait_for(lambda: runs.exists() and box.status()["recovery"]["runs"] >= 1,
             "the recipe run on a fresh 'exec tip 0'")
    freeze.write_text("")
    # unknown for its age (not any unknown reading, such as one from before the node's start)
    node = wait_for(lambda: box.program("node").get("healthy", True) is None
                    and "no fresh reading" in (box.program("node")["health_error"] or "")
                    and box.program("node"), "the frozen reading turned unknown by its age",
                    timeout=20)
    assert node["state"] == "running"
    # each program's reading ages on its own: the miner's may be one round younger
    status = wait_for(lambda: (s := box.status())["miner"]["hashrate"] is None and s,
                      "the miner's frozen reading turned unknown too", timeout=20)
    assert status["node"]["rpc"] is None
    before = runs.read_text().count("run")
    time.sleep(3.0)
    assert runs.read_text().count("run") == before  # no recipe on an unknown reading
    # each stuck probe is told, never replaced by another thread
    assert set(box.status()["observer"]["hung"]) == {"node", "miner", "prover"}
    assert "observer: the probe of node has not returned" in box.journal()
    assert box.status()["observer"]["restarts"] == 0
    lines = (box.root / "out" / "standing.log").read_text().splitlines()
    last = dict(w.split("=", 1) for w in lines[-1].split()[2:])
    assert last["blocks"] == "-" and last["synced"] == "-" and last["exec_tip"] == "-"
    freeze.unlink()
    wait_for(lambda: box.program("node").get("healthy") is True, "fresh readings again")
