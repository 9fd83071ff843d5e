"""A key that is refused is not "checked now" on the page."""
from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import page_fixture as F
import pytest
import test_page_keyless as K

from fleet.core.errors import AuthFailed
from fleet.core.times import iso
from fleet.state import last_tick


class Refused:
    name = "vast"

    def boxes(self) -> Any:
        raise AuthFailed("vast", "GET /instances", "HTTP 401: key refused")


def test_a_refused_key_is_not_called_checked_now(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from fleet.cli import common, page_cmd
    from fleet.cli import main as cli
    from fleet.state.registry import Registry

    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "XDG_CONFIG_HOME", "FLEET_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(common, "_state", {})
    monkeypatch.setattr(page_cmd, "_keyed_providers", lambda: {"vast": Refused()})
    (tmp_path / "fleet.toml").write_text(K.CONFIG)
    reg_path = tmp_path / "state" / "boxes.json"
    reg = Registry(reg_path)
    for r in F.rows():
        if r.kind == "standing" and r.provider == "vast":
            reg.add(r)
    now = datetime.now(UTC).replace(microsecond=0)
    last_tick.save(reg_path, 42, iso(now - timedelta(seconds=30)), F.health(), F.owed())
    r = CliRunner().invoke(cli.app, ["--config", str(tmp_path / "fleet.toml"), "page",
                                     "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "out" / "fleet.json").read_text())
    assert doc["sources"]["standing_verdicts"]["from"] == "unknown"  # nothing was checked
    assert doc["sources"]["note"].startswith("The standing boxes could not be checked now")
    assert "checked now" not in r.output and "unknown (the check failed)" in r.output
