"""The operations' shell programs (operations/scripts/*.sh.j2): rendered exactly as the commands
the operations always sent (scripts/*.sh, golden copies), parsed by sh and bash, and rendered
only from names that are given, each a plain shell word."""

import shutil
import subprocess
from pathlib import Path

import pytest
from jinja2 import UndefinedError

from agent.contract import ROOT
from operations import agent, hook, release, script

GOLDEN = Path(__file__).parent / "scripts"
RENDERED = {
    "agent_install": agent._INSTALL,
    "agent_start": agent._START,
    "agent_restart": agent._RESTART,
    "release_unpack": release._UNPACK,
    "release_verify": release._VERIFY,
    "release_point": release.POINT_SCRIPT,
    "boot": hook.boot_script(ROOT),
}


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_a_script_renders_byte_for_byte_as_the_golden_copy(name: str) -> None:
    assert RENDERED[name] == (GOLDEN / f"{name}.sh").read_text()


def test_every_script_file_is_rendered_by_an_operation() -> None:
    files = {p.name.removesuffix(".sh.j2")
             for p in (Path(script.__file__).parent / "scripts").glob("*.sh.j2")}
    assert files - set(RENDERED) == {"release_staged"}  # included by unpack and verify


@pytest.mark.parametrize("shell", ["sh", "bash"])
@pytest.mark.parametrize("name", sorted(RENDERED))
def test_a_rendered_script_parses(name: str, shell: str) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell} here")
    r = subprocess.run([shell, "-n"], input=RENDERED[name], text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


def test_a_name_the_caller_did_not_give_is_an_error_not_an_empty_string() -> None:
    with pytest.raises(UndefinedError, match="POINTER"):
        script.render("release_point", RUN="run", SWITCH_LOCK="switch.lock")


@pytest.mark.parametrize("value", ["two words", "", "a'b", "$HOME", "x;rm"])
def test_a_value_that_is_not_a_plain_shell_word_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="not a plain shell word"):
        script.render("agent_start", VENV_PYTHON=value, CONFIG="agent.toml")
