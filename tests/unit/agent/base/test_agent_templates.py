"""Command templates are checked at config load by rendering them: a conversion or a format
spec that Python's str.format refuses is one line and exit status 2 there, never an error at
every start (which would stop every reconcile, its NVML re-check and its rotation with it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from agentbox import Box, wait_for

from agent.base.config import load_config
from agent.base.errors import AgentError
from agent.base.template import MAX_ARG_BYTES, TemplateError, render_argv


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


@pytest.mark.parametrize("text, why", [
    ("--tag={name:{p2p_public_port:.0}}", "nested"),  # a value unknown at run time
    ("{node_bin:{name:.0}>5}", "nested"),
    ("{node_bin:>9999999999999}", "over"),  # no allocation of the width attempted
    ("{node_bin:>200000}", "over"),  # an exec would fail with E2BIG
    ("{root:.999999999}", "over"),
])
def test_a_template_that_would_fail_or_overflow_at_run_time_is_one_line_exit_2(
        tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(f"[programs.node]\ncommand = ['x', '{text}']\n")
    done = subprocess.run([sys.executable, "-m", "agent", "status", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ")
    assert "programs.node.command: bad template" in done.stderr
    assert why in done.stderr
    assert done.stderr.count("\n") == 1


def test_arguments_each_within_the_limit_but_past_an_exec_together_are_one_line_exit_2(
        tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    args = ", ".join(["'{name:100000}'"] * 30)  # 3 MB together: every exec would fail E2BIG
    path.write_text(f"[programs.node]\ncommand = ['/bin/true', {args}]\n")
    done = subprocess.run([sys.executable, "-m", "agent", "status", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ")
    assert "programs.node.command: the command and its environment render to" in done.stderr
    assert done.stderr.count("\n") == 1


def test_a_render_past_the_argument_limit_at_run_time_is_refused_with_the_reason() -> None:
    long_root = "/" + "r" * 4000
    template = ["x", "{root}" * 40]  # 240 bytes with sample values, 160 KB with this root
    with pytest.raises(TemplateError) as err:
        render_argv(template, {"root": long_root})
    assert "over" in str(err.value) and "bytes" in str(err.value)


def test_a_command_too_long_to_fill_in_at_run_time_puts_the_reason_on_the_status(
        box: Box) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    # 18 KB with the sample values at load; over the kernel's argument limit with the real root
    long_arg = "--tag=" + "{root}" * (MAX_ARG_BYTES // len(str(box.root)) + 100)
    box.configure(programs=("node",), program_overrides={"node": {
        "command": ["{node_bin}", "node", "--rpc-port", str(box.rpc_port), long_arg]}})
    box.start_agent()
    wait_for(lambda: "cannot fill in its command" in (box.program("node").get("reason") or ""),
             "the node's reason to name the command it cannot fill in")
    node = box.program("node")
    assert node["state"] == "blocked" and "bytes, over the" in node["reason"]
    assert not box.running("node")
