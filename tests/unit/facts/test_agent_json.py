"""The agent's JSON facts without pyinfra (`facts.agent_json`) are the pyinfra facts' own command
and parser, and a loop tick's code loads neither pyinfra nor graphql-core (both cost the
healthy tick more CPU than its own work)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyinfra.api import StringCommand
from pyinfra.api.command import QuoteString
from pyinfra.api.exceptions import FactProcessError
from repo_root import ROOT

from agent import contract
from facts import agent_json
from facts.box import AgentStatus, GpuIdentity, NodeReadback

REPO = ROOT
ROOTS = ["/root/fleet", "/tmp/a b", "/x/it's", "$(touch /tmp/ran)", "-n", ""]
FACTS = [(AgentStatus, agent_json.STATUS, "status", True),
         (GpuIdentity, agent_json.GPU, "gpu", False),
         (NodeReadback, agent_json.READBACK, "readback", True)]


@pytest.mark.parametrize("root", ROOTS)
@pytest.mark.parametrize(("fact", "plain", "sub", "config"), FACTS)
def test_the_command_is_the_pyinfra_facts_word_for_word(fact, plain, sub, config, root) -> None:
    # the command as the facts built it with pyinfra's own quoting, before they shared it
    theirs = StringCommand(
        "cd", QuoteString(root), f"2>/dev/null && test -x {contract.VENV_PYTHON} &&",
        f"{contract.VENV_PYTHON} -m agent", sub,
        f"--config {contract.CONFIG}" if config else "", "|| true",
    ).get_raw_value()
    assert plain.command(root) == theirs
    assert fact().command(root=root).get_raw_value() == theirs
    assert plain.name == fact.__name__


@pytest.mark.parametrize(("fact", "plain", "sub", "config"), FACTS)
def test_the_parser_is_the_pyinfra_facts(fact, plain, sub, config) -> None:
    doc = {"alive": True, "node": {"blocks": 7}}
    lines = json.dumps(doc, indent=1).splitlines()
    assert plain.process(lines) == fact().process(lines) == doc
    assert plain.process([]) == fact().process([]) == {}
    for bad, why in ((["this is not json"], "not JSON"), (["[1, 2]"], "expected an object")):
        with pytest.raises(agent_json.Unreadable, match=why) as plain_error:
            plain.process(bad)
        with pytest.raises(FactProcessError, match=why) as fact_error:
            fact().process(bad)
        assert str(plain_error.value) == str(fact_error.value)
        assert str(fact_error.value).startswith(f"{fact.__name__}: ")


def test_a_loop_tick_loads_neither_pyinfra_nor_graphql() -> None:
    # every module `fleet loop` imports, at the top and inside the command and its after-tick
    # hook, in a fresh interpreter
    code = """
import sys
import fleet.cli.main
from fleet import page
from fleet.ops import check, loop, rent, watchdog
from fleet.ops.converge import converge, write_peers
from fleet.state import bills, last_tick
from fleet.providers import factory
print(sorted(m for m in ("pyinfra", "graphql", "paramiko") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]", out
