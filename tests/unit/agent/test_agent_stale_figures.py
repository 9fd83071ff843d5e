"""Figures from a program that is not running are unknown: once the GPU programs are stopped,
status.json and the RESULT line show no hashrate and no prover state (`-`), even while their
status files still read fresh."""

from __future__ import annotations

from agentbox import Box, gpu_spec, wait_for


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
