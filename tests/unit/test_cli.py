"""Bad input gives one line and exit status 2, and changes nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
[fleet]
registry = "state/boxes.json"
daily_budget_usd = 10
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


def fleet(tmp_path: Path, *args: str, config: str = CONFIG) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(config)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RUNPOD_", "VAST_", "FLEET_"))}
    env["FLEET_CONFIG"] = str(cfg)
    env["HOME"] = str(tmp_path)  # no provider key files
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "fleet.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "args, message",
    [
        (["offers", "nope"], "error: unknown role 'nope' (roles: live)"),
        (["rent", "nope"], "error: unknown role 'nope'"),
        (["rent", "live", "--provider", "aws"], "error: unknown provider 'aws'"),
        (["rent", "live", "--label", "Not A Label"], "error: bad label 'Not A Label'"),
        (["destroy", "UPPER"], "error: bad label 'UPPER'"),
        (["destroy", "live-vast-aaaaaa"], "error: no box labelled 'live-vast-aaaaaa'"),
        (["sandbox", "fault", "meteor", "vast"], "error: unknown fault 'meteor'"),
        (["rent", "live", "--gpus", "0"], "error:"),
        (["frobnicate"], "error:"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    r = fleet(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "state" / "boxes.json").exists()  # nothing written


def test_bad_config_is_exit_2(tmp_path: Path) -> None:
    r = fleet(tmp_path, "roster", config=CONFIG + "\nsurprise = 1\n")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: ") and "unknown key 'surprise'" in r.stderr


def test_missing_key_is_one_line(tmp_path: Path) -> None:
    r = fleet(tmp_path, "roster")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "RUNPOD_API_KEY" in r.stderr
