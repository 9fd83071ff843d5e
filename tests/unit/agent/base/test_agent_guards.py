"""agent.toml fails closed: a GPU program needs an admitted driver, and a program whose status
says unhealthy is restarted after a finite time unless the config asks for report-only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.base.config import load_config
from agent.base.errors import AgentError

NODE = '[programs.node]\ncommand = "{node_bin}"\nstatus_url = "http://127.0.0.1:16110/status"\n'
MINER = '[programs.miner]\ncommand = "/opt/miner"\nneeds_gpu = true\n'


def write(tmp: Path, text: str) -> Path:
    path = tmp / "agent.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", [
    MINER,                                     # no admitted_driver at all
    'admitted_driver = ""\n' + MINER,          # "" no longer admits any driver for GPU work
    'admitted_driver = "  "\n' + MINER,
])
def test_a_gpu_program_without_an_admitted_driver_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(AgentError) as err:
        load_config(write(tmp_path, text))
    assert err.value.exit_code == 2
    assert "programs.miner needs the GPU but admitted_driver is not set" in str(err.value)
    assert "\n" not in str(err.value)


def test_programs_without_the_gpu_need_no_driver(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, NODE))
    assert cfg.admitted_driver == "" and not cfg.programs["node"].needs_gpu
    cfg = load_config(write(tmp_path, 'admitted_driver = "580.95.05"\n' + NODE + MINER))
    assert cfg.programs["miner"].needs_gpu and cfg.admitted_driver == "580.95.05"


def test_every_command_refuses_the_unguarded_config_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, f'root = "{tmp_path}"\n' + NODE + MINER)
    # run in the foreground: were the config taken, the agent would stay attached and the
    # timeout would end it, instead of leaving a detached agent behind
    for command in (["run", "--foreground"], ["status"], ["admit"], ["ports"], ["stop"]):
        done = subprocess.run([sys.executable, "-m", "agent", *command, "--config", str(path)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stdout == "" and done.stderr.count("\n") == 1
        assert done.stderr.startswith("error: ") and "admitted_driver" in done.stderr
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_an_unhealthy_program_is_restarted_after_300_s_by_default(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, NODE))
    assert cfg.programs["node"].restart_unhealthy_after_s == 300.0
    cfg = load_config(write(tmp_path, NODE + "restart_unhealthy_after_s = 0\n"))
    assert cfg.programs["node"].restart_unhealthy_after_s == 0.0  # report only, on request
    cfg = load_config(write(tmp_path, NODE + "restart_unhealthy_after_s = 12.5\n"))
    assert cfg.programs["node"].restart_unhealthy_after_s == 12.5
    with pytest.raises(AgentError, match="restart_unhealthy_after_s must be a number >= 0"):
        load_config(write(tmp_path, NODE + "restart_unhealthy_after_s = -1\n"))
