"""`fleet loop`'s bad input and its leadership: one line, exit 2, nothing asked of any
provider; one loop leads a fleet, a second `--once` is refused naming it, and the next to lead
after it has a higher epoch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_fixture import CONFIG, fleet
from state_fixture import dump

from fleet.providers.base import Box
from fleet.state.db import open_db
from fleet.state.leader import Leadership, me


@pytest.mark.parametrize(("args", "extra", "message"), [
    (["--interval", "-5"], "", "error: --interval must be a positive number of seconds"),
    (["--interval", "0"], "", "error: --interval must be a positive number of seconds"),
    ([], "[[roster.ghost]]\nprovider = \"vast\"\ncard = \"RTX 4090\"\n",
     "roster.ghost: unknown role 'ghost'"),
    (["--interval", "nan"], "", "error: --interval must be a positive number of seconds"),
    (["--interval", "inf"], "", "error: --interval must be a positive number of seconds"),
    # the orphan grace (default 600 s) is at least two intervals, overridden or not
    (["--interval", "301"], "", "error: --interval 301 leaves [loop] orphan_grace_s (600) "
     "under two intervals"),
    (["--interval", "20"], "[loop]\ninterval_s = 10\norphan_grace_s = 30\n",
     "error: --interval 20 leaves [loop] orphan_grace_s (30) under two intervals"),
    ([], "[loop]\ninterval_s = -1\n", "loop.interval_s: must be positive"),
    ([], "[loop]\nconverge_timeout_s = 0\n", "loop.converge_timeout_s: must be positive"),
    ([], "[loop]\ninterval_s = nan\n", "loop.interval_s: must be a finite number"),
    ([], "[loop]\norphan_grace_s = nan\n", "loop.orphan_grace_s: must be a finite number"),
    ([], "[loop]\ninterval_s = 10\norphan_grace_s = 5\n",
     "loop.orphan_grace_s: must be at least two interval_s"),
    ([], "[loop]\ncolour = 1\n", "loop: unknown key 'colour'"),
    # a duration too long to sleep or to mean anything: refused before the loop starts
    ([], "[loop]\ninterval_s = 1e10\norphan_grace_s = 2e10\n", "loop.interval_s: at most"),
    (["--interval", "1e10"], "[loop]\norphan_grace_s = 86400\n",
     "error: --interval must be a positive number of seconds, at most 3600"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], extra: str,
                                      message: str) -> None:
    r = fleet(tmp_path, "loop", "--once", *args, config=CONFIG + extra)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert dump(tmp_path / "state" / "boxes.json") == ""  # nothing changed
    assert not (tmp_path / "state" / "page").exists()


def test_an_interval_of_half_the_orphan_grace_is_taken(tmp_path: Path) -> None:
    r = fleet(tmp_path, "loop", "--once", "--interval", "300")  # the default grace: 600 s
    assert r.returncode == 2 and "RUNPOD_API_KEY" in r.stderr, r.stderr  # past the checks


def test_a_page_directory_that_cannot_be_written_is_refused(tmp_path: Path) -> None:
    (tmp_path / "blocked").write_text("a file in the way\n")
    r = fleet(tmp_path, "loop", "--once", "--page", str(tmp_path / "blocked"))
    assert r.returncode == 2 and "a file is in the way" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_second_loop_while_one_leads_refuses_naming_it_and_the_next_leads_higher(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    from fleet.ops import loop

    ticked: list[object] = []
    monkeypatch.setattr(loop, "run", lambda *a: ticked.append(a))
    registry = tmp_path / "state" / "boxes.json"
    first = Leadership(open_db(registry), holder="ops-1 pid 4242")
    fence = first.campaign()  # the first loop
    assert fence is not None and fence.epoch == 1
    assert run_fleet(tmp_path, monkeypatch, _Account(), "loop", "--once") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: another fleet loop leads this fleet: ops-1 pid 4242 "
                          "(epoch 1, leading since "), err
    assert "not starting a second" in err and len(err.strip().splitlines()) == 1, err
    assert ticked == [] and first.lost() is None  # it still leads
    first.resign()  # the first loop ends
    assert run_fleet(tmp_path, monkeypatch, _Account(), "loop", "--once") == 0
    assert f"leading as {me()} (epoch 2)" in capsys.readouterr().err
    assert len(ticked) == 1
    lead = first.current()
    assert lead is not None and (lead.epoch, lead.holder) == (2, me())
    assert first.campaign() is not None and first.fence == fence.__class__(3, "ops-1 pid 4242")


# --- an empty registry beside another fleet: most likely a wrong path ----------------------

class _Account:
    """A provider whose account lists `labels`; nothing else is asked of it."""

    name = "vast"

    def __init__(self, *labels: str) -> None:
        self.labels = labels

    def boxes(self) -> list[Box]:
        return [Box("vast", str(10 + i), label, "RTX 4090", 1, 0.4, "running")
                for i, label in enumerate(self.labels)]


def run_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: object,
              *args: str) -> int:
    """`fleet ARGS` in this process with `provider` as the only provider: its exit status."""
    from fleet.cli import common
    from fleet.cli import main as cli

    (tmp_path / "fleet.toml").write_text(CONFIG)
    monkeypatch.setattr(common, "_state", {})
    monkeypatch.setattr(common, "providers", lambda: {"vast": provider})
    monkeypatch.setattr(sys, "argv", ["fleet", "--config", str(tmp_path / "fleet.toml"), *args])
    with pytest.raises(SystemExit) as e:
        cli.main()
    return int(e.value.code or 0)


THEIRS = ("live-3fa9c1-vast-0b12ef", "live-3fa9c1-vast-0b12ef-r1", "live-debug")


@pytest.mark.parametrize("command", [["loop", "--once"], ["rent", "live"]])
def test_an_empty_registry_beside_another_fleets_boxes_refuses_to_rent_and_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: list[str]) -> None:
    from fleet.ops import loop, offers

    monkeypatch.setattr(loop, "run", lambda *a: pytest.fail("the loop started"))
    monkeypatch.setattr(offers, "search", lambda *a, **k: pytest.fail("offers searched"))
    code = run_fleet(tmp_path, monkeypatch, _Account(*THEIRS), *command)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: the registry ") and "holds no live box" in err
    assert "2 of another fleet (fleet id 3fa9c1)" in err
    assert "live-3fa9c1-vast-0b12ef (vast/10)" in err and "-r1 (vast/11)" in err
    assert "live-debug" not in err and "--new-fleet" in err  # a person's box is no fleet
    assert dump(tmp_path / "state" / "boxes.json") == ""  # nothing written


def test_new_fleet_starts_the_loop_beside_another_fleet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.ops import loop

    started: list[object] = []
    monkeypatch.setattr(loop, "run", lambda *a: started.append(a))
    code = run_fleet(tmp_path, monkeypatch, _Account(*THEIRS), "loop", "--once",
                        "--new-fleet")
    assert code == 0 and len(started) == 1


def test_a_registry_with_live_rows_or_an_account_of_no_other_fleet_starts_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.core.boxes import Row
    from fleet.ops import loop
    from fleet.state.registry import Registry

    started: list[object] = []
    monkeypatch.setattr(loop, "run", lambda *a: started.append(a))
    assert run_fleet(tmp_path, monkeypatch, _Account("live-debug"), "loop", "--once") == 0
    reg = Registry(tmp_path / "state" / "boxes.json")
    own = f"live-{reg.fleet_id()}-vast-00000a"
    reg.add(Row(label=own, provider="vast", role="live", kind="standing", card="RTX 4090",
                gpu_count=1, usd_per_hour=0.4, status="running"))
    assert run_fleet(tmp_path, monkeypatch, _Account(*THEIRS), "loop", "--once") == 0
    reg.update(own, status="destroyed")  # torn down; its box still listed is its own
    assert run_fleet(tmp_path, monkeypatch, _Account(own), "loop", "--once") == 0
    assert len(started) == 3


def test_a_registry_of_a_fleet_torn_down_beside_another_fleets_boxes_refuses_to_rent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    from fleet.core.boxes import Row
    from fleet.ops import loop
    from fleet.state.registry import Registry

    monkeypatch.setattr(loop, "run", lambda *a: pytest.fail("the loop started"))
    Registry(tmp_path / "state" / "boxes.json").add(Row(
        label="live-aaaaaa-vast-000001", provider="vast", role="live", kind="standing",
        card="RTX 4090", gpu_count=1, usd_per_hour=0.4, status="destroyed"))
    assert run_fleet(tmp_path, monkeypatch, _Account(*THEIRS), "loop", "--once") == 2
    err = capsys.readouterr().err
    assert "holds no live box" in err and "live-3fa9c1-vast-0b12ef" in err, err


def test_an_empty_registry_whose_account_listing_fails_refuses_to_rent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    from fleet.core.errors import ProviderError
    from fleet.ops import loop

    class Blind(_Account):
        def boxes(self) -> list[Box]:
            raise ProviderError("vast", "list instances", "HTTP 503")

    monkeypatch.setattr(loop, "run", lambda *a: pytest.fail("the loop started"))
    code = run_fleet(tmp_path, monkeypatch, Blind(), "loop", "--once")
    err = capsys.readouterr().err
    assert code != 0 and len(err.strip().splitlines()) == 1 and "HTTP 503" in err, err
    assert "cannot be told" in err
