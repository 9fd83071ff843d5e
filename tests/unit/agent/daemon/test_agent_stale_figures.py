"""Figures from a program that is not running are unknown: once the GPU programs are stopped,
status.json and the RESULT line show no hashrate and no prover state (`-`), even while their
status files still read fresh."""

from __future__ import annotations

import os
import signal

from agentbox import PY, Box, gpu_spec, wait_for


def _last_result(box: Box) -> dict[str, str]:
    log = box.root / "out" / "standing.log"
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("RESULT standing")]
    return dict(w.split("=", 1) for w in lines[-1].split()[2:]) if lines else {}


def test_figures_of_stopped_programs_print_as_unknown(box: Box) -> None:
    box.configure(programs=("miner", "prover"), result_every_s=1)
    box.start_agent()
    wait_for(lambda: _last_result(box).get("miner_rate", "-") != "-"
             and _last_result(box).get("prover") == "proving", "figures while they run")
    box.set_gpu(gpu_spec(driver="580.65.06"))  # the driver changed: both must stop
    wait_for(lambda: not box.running("miner") and not box.running("prover"),
             "both GPU programs stopped")
    wait_for(lambda: box.program("miner").get("state") == "blocked", "the miner blocked")
    box.wait_ticks(2)
    status = box.status()
    assert status["miner"]["hashrate"] is None and status["prover"]["state"] is None
    written = (box.root / "out" / "standing.log").stat().st_size
    wait_for(lambda: (box.root / "out" / "standing.log").stat().st_size > written,
             "a RESULT line after the stop")
    fields = _last_result(box)
    assert fields["miner_rate"] == "-" and fields["prover"] == "-", fields


def _miner_whose_successor_writes_nothing(box: Box, **miner: object) -> None:
    """A miner that writes its status file on its first run only; any later start just
    sleeps, so its status file stays the dead predecessor's."""
    mark = box.tmp / "second-run"
    wrap = box.bin / "minerwrap"
    wrap.write_text(f"#!/bin/sh\nif [ -e {mark} ]; then exec sleep 1000; fi\n: > {mark}\n"
                    f"exec {PY} {box.bin}/miner.py miner --status {box.root}/run/miner.json\n")
    wrap.chmod(0o755)
    box.configure(programs=("miner",), result_every_s=1, program_overrides={
        "miner": {"command": [str(wrap)], **miner}})


def test_a_dead_miners_figures_are_not_shown_for_its_successor(box: Box) -> None:
    _miner_whose_successor_writes_nothing(box)
    box.start_agent()
    wait_for(lambda: box.status().get("miner", {}).get("hashrate"), "the miner's figures")
    old = box.pid_of("miner")
    assert old is not None
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: box.pid_of("miner") not in (None, old), "the successor running")
    box.wait_ticks(3)  # readings of the successor, its status file still fresh (60 s)
    status = box.status()
    assert box.pid_of("miner") not in (None, old)
    assert status["miner"]["hashrate"] is None, status["miner"]
    written = (box.root / "out" / "standing.log").stat().st_size
    wait_for(lambda: (box.root / "out" / "standing.log").stat().st_size > written,
             "a RESULT line with the successor running")
    assert _last_result(box)["miner_rate"] == "-"


def test_figures_of_a_status_file_past_its_health_age_print_as_unknown(box: Box) -> None:
    status_file = box.root / "run" / "miner.json"
    # writes its status file once, then never again; a moment after its start, as a start time
    # is known to a clock tick only and a write within it is not taken as this process's
    once = box.bin / "miner-once"
    once.write_text(f"#!/bin/sh\nsleep 0.2\nprintf '{{\"hashrate\": 1000.0}}' > {status_file}.tmp\n"
                    f"mv {status_file}.tmp {status_file}\nexec sleep 1000\n")
    once.chmod(0o755)
    box.configure(programs=("miner",), result_every_s=1, program_overrides={"miner": {
        "command": [str(once)], "health_max_age_s": 1}})
    box.start_agent()
    wait_for(lambda: "unchanged for" in (box.status().get("miner", {}).get("status_error")
                                         or ""), "the status file past its health age")
    status = box.status()
    assert box.pid_of("miner") is not None
    assert status["miner"]["hashrate"] is None, status["miner"]
    written = (box.root / "out" / "standing.log").stat().st_size
    wait_for(lambda: (box.root / "out" / "standing.log").stat().st_size > written,
             "a RESULT line after that")
    assert _last_result(box)["miner_rate"] == "-"


def test_figures_written_ahead_of_the_clock_are_not_shown_for_a_successor(box: Box) -> None:
    """A status file dated in the future (a clock stepped back after the write, or a writer
    that sets it) cannot tell whose figures it holds: they are unknown, never the successor's."""
    status_file = box.root / "run" / "miner.json"
    mark = box.tmp / "second-run"
    wrap = box.bin / "minerwrap"  # the first run writes, dates it an hour ahead, and dies
    wrap.write_text(
        f"#!/bin/sh\nif [ -e {mark} ]; then exec sleep 1000; fi\n: > {mark}\nsleep 3\n"
        f"printf '{{\"hashrate\": 4242.0}}' > {status_file}.tmp\n"
        f"touch -d '+1 hour' {status_file}.tmp\nmv {status_file}.tmp {status_file}\n"
        "kill -KILL $$\n")
    wrap.chmod(0o755)
    box.configure(programs=("miner",), result_every_s=1, tick_s=2.0,
                  program_overrides={"miner": {"command": [str(wrap)]}})
    box.start_agent()
    wait_for(lambda: mark.exists() and box.pid_of("miner"), "the first run")
    first = box.pid_of("miner")
    wait_for(lambda: box.pid_of("miner") not in (None, first), "the successor running", 20)
    successor = box.pid_of("miner")
    for _ in range(4):  # readings of the successor over several ticks
        box.wait_ticks(1)
        assert box.pid_of("miner") == successor
        assert box.status()["miner"]["hashrate"] is None, box.status()["miner"]
