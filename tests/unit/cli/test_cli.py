"""Bad input gives one line and exit status 2, and changes nothing."""

from pathlib import Path

import pytest
from cli_fixture import CONFIG, fleet
from state_fixture import dump


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
        (["offers", "live", "--card", "RTX 9999"], "error: unknown card 'RTX 9999' (known: "),
        (["rent", "live", "--card", "rtx4090"], "error: unknown card 'rtx4090' (known: "),
        (["rent", "live", "--card", ""], "error: unknown card '' (known: "),
        (["frobnicate"], "error:"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    r = fleet(tmp_path, *args)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert "Traceback" not in r.stderr
    assert dump(tmp_path / "state" / "boxes.json") == ""  # nothing written


def test_bad_config_is_exit_2(tmp_path: Path) -> None:
    r = fleet(tmp_path, "roster", config=CONFIG + "\nsurprise = 1\n")
    assert r.returncode == 2
    assert r.stderr.strip().startswith("error: ") and "unknown key 'surprise'" in r.stderr


def test_missing_key_is_one_line(tmp_path: Path) -> None:
    r = fleet(tmp_path, "roster")
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "RUNPOD_API_KEY" in r.stderr


@pytest.mark.parametrize("command", ["offers", "rent"])
@pytest.mark.parametrize("spelling", ["rtx 4090", "NVIDIA GeForce RTX 4090", " RTX  4090"])
def test_a_card_option_in_any_spelling_asks_for_the_fleet_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, spelling: str) -> None:
    from typer.testing import CliRunner

    from fleet.cli import boxes_cmd, common
    from fleet.cli import main as cli

    asked: list[str | None] = []

    def search(_role: object, _providers: object, card: str | None = None,
               **_kw: object) -> tuple[list[object], list[object]]:
        asked.append(card)
        return [], []

    monkeypatch.setattr(common, "_state", {})
    monkeypatch.setattr(common, "providers", dict)
    monkeypatch.setattr(boxes_cmd.offers_mod, "search", search)
    (tmp_path / "fleet.toml").write_text(CONFIG)
    extra = ["--dry-run"] if command == "rent" else []
    CliRunner().invoke(cli.app, ["--config", str(tmp_path / "fleet.toml"), command, "live",
                                 "--card", spelling, *extra])
    assert asked == ["RTX 4090"]
