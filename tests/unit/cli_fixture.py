"""The fleet CLI run as the operator runs it: its own process, a fleet.toml in the test's
folder, no provider keys."""

import os
import subprocess
import sys
from pathlib import Path

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
    # the test's own database (FLEET_DATABASE_URL, on PostgreSQL) goes with it; no other setting
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RUNPOD_", "VAST_", "FLEET_")) or k == "FLEET_DATABASE_URL"}
    env["FLEET_CONFIG"] = str(cfg)
    env["HOME"] = str(tmp_path)  # no provider key files
    env["COLUMNS"] = "200"
    return subprocess.run([sys.executable, "-m", "fleet.cli", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
