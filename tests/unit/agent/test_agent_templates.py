"""Command templates are checked at config load by rendering them: a conversion or a format
spec that Python's str.format refuses is one line and exit status 2 there, never an error at
every start (which would stop every reconcile, its NVML re-check and its rotation with it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.base.config import load_config
from agent.base.errors import AgentError


@pytest.mark.parametrize("key, text", [
    ("command", "{node_bin!x} --p2p={p2p_port}"),
    ("command", "{node_bin:d}"),
    ("command", "{node_bin:>>>}"),
    ("cwd", "{root!z}"),
    ("log", "{root}/log/{name:d}.log"),
    ("status_file", "{root:.2f}"),
])
def test_a_template_that_cannot_be_rendered_is_refused_at_load(tmp_path: Path, key: str,
                                                                text: str) -> None:
    body = "[programs.node]\n"
    body += f"command = '{text}'\n" if key == "command" else f"command = 'x'\n{key} = '{text}'\n"
    path = tmp_path / "agent.toml"
    path.write_text(body)
    with pytest.raises(AgentError) as err:
        load_config(path)
    assert err.value.exit_code == 2
    assert f"programs.node.{key}" in str(err.value) and "bad template" in str(err.value)
    done = subprocess.run([sys.executable, "-m", "agent", "status", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1


def test_an_env_template_that_cannot_be_rendered_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[programs.node]\ncommand = 'x'\n[programs.node.env]\nA = '{p2p_port!r:d}'\n")
    with pytest.raises(AgentError) as err:
        load_config(path)
    assert err.value.exit_code == 2 and "programs.node.env.A" in str(err.value)
