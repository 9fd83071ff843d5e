"""Every CLI table readable in an 80-column terminal: each command's table, built by the
command's own table code from realistic rows, rendered at 80 and at 200 columns. At 80 it folds
into one block per row (the label alone on its first line, whole, then `column: value` lines);
at 200 it is the wide table, exactly as Rich prints it; both carry every cell's words and
figures, and neither cuts a thing (no `…`)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fleet.cli import boxes_cmd, check_cmd, common, oneshot_cmd, publish_cmd, tables
from fleet.core.boxes import Row
from fleet.core.verdicts import Health, Owed, Watch
from fleet.ops import budget
from fleet.ops import publish as pub
from fleet.ops.oneshot import Summary
from fleet.ops.teardown import Outcome
from fleet.providers.base import Box, Offer
from fleet.state import releases

# the labels the fleet makes (fleet/core/labels.py): <role>-<fleet id>-<provider>-<6 hex>[-r<n>]
VALIDATOR = "validator-3fa9c1-vast-0b12ef"
VALIDATOR_R2 = "live-validator-eu-3fa9c1-runpod-7d41e0-r12"  # a 20-char role, re-rented: 42
BENCH = "bench-gemm-3fa9c1-runpod-c29a5f"
BENCH_VAST = "bench-gemm-3fa9c1-vast-e81d07"
FRAME = "┃│┏┓┗┛━─┡┩└┘┌┐"  # any of Rich's box characters: the wide table's frame


# --- rendering and reading back -------------------------------------------------------------

def render(make: Callable[[], Table], width: int) -> str:
    """What `tables.show` prints for a fresh table from `make` at `width` columns, as text."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    tables.show(console, make())
    return console.export_text()


def rich_render(make: Callable[[], Table], width: int) -> str:
    """The same table as Rich prints it on its own: the wide table, unchanged."""
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(make())
    return console.export_text()


def plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def cells(table: Table) -> list[list[str]]:
    """Each row's cells as text, in column order."""
    columns = [list(col.cells) for col in table.columns]
    return [[plain(col[i]) for col in columns] for i in range(table.row_count)]


def flat(text: str) -> str:
    """Whitespace runs as one space: a value wrapped onto two lines reads as one."""
    return " ".join(text.split())


def lines_of(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines()]


def assert_every_cell_in(table: Table, text: str) -> None:
    for row in cells(table):
        for cell in row:
            assert flat(cell) in flat(text), (cell, text)
    assert flat(plain(table.title)) in flat(text)
    if table.caption:
        assert flat(plain(table.caption)) in flat(text)
    assert "…" not in text, text


def assert_folds_at_80_and_is_whole_at(make: Callable[[], Table], wide: int = 200) -> None:
    """The checks every per-box table passes (see the module's docstring)."""
    table = make()
    rows, headers = cells(table), [plain(c.header) for c in table.columns]
    assert len(rows) >= 2 and tables.natural_width(Console(width=80), table) > 80
    narrow, whole = render(make, 80), render(make, wide)
    assert_every_cell_in(table, narrow)
    assert_every_cell_in(table, whole)
    # at 80: no frame, nothing past the edge; title, one block per row, caption
    assert not set(FRAME) & set(narrow), narrow
    assert all(len(line) <= 80 for line in lines_of(narrow)), narrow
    blocks = "\n".join(lines_of(narrow)).strip("\n").split("\n\n")
    assert flat(blocks[0]) == flat(plain(table.title))
    assert len(blocks) == 1 + len(rows) + (1 if table.caption else 0), narrow
    if table.caption:
        assert flat(blocks[-1]) == flat(plain(table.caption))
    for row, block in zip(rows, blocks[1:], strict=False):
        first, *rest = block.split("\n")
        assert first == row[0], (first, row[0])  # the label, whole, on its own line
        for header, cell in zip(headers[1:], row[1:], strict=True):
            if cell:
                assert flat(f"{header}: {cell}") in flat("\n".join(rest)), (header, block)
    # wide enough: Rich's own table, each row on one line of it
    assert whole == rich_render(make, wide)
    assert set(FRAME) & set(whole)
    whole_lines = lines_of(whole)
    assert any(all(h in line for h in headers) for line in whole_lines), whole
    for row in rows:
        assert any(all(c in line for c in row) for line in whole_lines), (row, whole)


# --- each command's table, from realistic rows ----------------------------------------------

NOW = datetime.now(UTC)


def _iso(ago: timedelta) -> str:
    return (NOW - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


def _registry_rows() -> list[Row]:
    return [
        Row(label=VALIDATOR, provider="vast", role="validator", kind="standing",
            card="RTX 4090", gpu_count=1, usd_per_hour=0.412, status="running",
            provider_id="18234567", ssh_host="203.0.113.45", ssh_port=41022, standing=True,
            created_at=_iso(timedelta(hours=5, minutes=12))),
        Row(label=VALIDATOR_R2, provider="runpod", role="live-validator-eu", kind="standing",
            card="RTX 4090", gpu_count=1, usd_per_hour=0.69, status="running",
            provider_id="x7k2m9p4q1w8e5", ssh_host="194.68.245.12", ssh_port=22105,
            created_at=_iso(timedelta(minutes=41))),
        Row(label=BENCH, provider="runpod", role="bench", kind="oneshot", card="H100 SXM",
            gpu_count=1, usd_per_hour=2.69, status="running", job="gemm-sweep",
            job_state="running", created_at=_iso(timedelta(hours=1, minutes=3))),
    ]


def _roster_rows() -> tuple[list[dict[str, str]], str]:
    """The roster's cells and caption, made once (an uptime reads the clock)."""
    regs = _registry_rows()
    rows = [boxes_cmd.roster_row(r, r.status) for r in regs]
    rows.append(boxes_cmd.orphan_row(Box(
        provider="vast", box_id="18299031", label=BENCH_VAST, card="RTX 4090", gpu_count=1,
        usd_per_hour=0.398, status="running")))
    rows.append(boxes_cmd.owed_row(Owed(role="validator", provider="vast", card="RTX 4090",
                                       gpus=1, since=_iso(timedelta(minutes=7)),
                                       reason="no admissible offer")))
    total = sum(r.usd_per_hour for r in regs if r.live)
    money = budget.today(regs, 100.0, NOW, None).to_dict()
    return rows, boxes_cmd.roster_caption(total, money)


def test_roster() -> None:
    rows, caption = _roster_rows()
    # with its machine column and an owed box's reason, the roster is whole from 210 columns
    assert_folds_at_80_and_is_whole_at(lambda: boxes_cmd.roster_table(rows, caption), 240)


def test_offers() -> None:
    offers = [
        Offer(provider="vast", offer_id="28764310", card="RTX 4090", gpu_count=1,
              usd_per_hour=0.348, driver="580.95.05", cuda="13.0", country="Norway"),
        Offer(provider="runpod", offer_id="NVIDIA GeForce RTX 4090:SECURE:EU-RO-1",
              card="RTX 4090", gpu_count=1, usd_per_hour=0.69, cuda="12.8", cloud="SECURE"),
    ]
    assert_folds_at_80_and_is_whole_at(
        lambda: boxes_cmd.offers_table("validator", "580.95.05", offers))


def test_rented() -> None:
    row = _registry_rows()[1]
    make = lambda: boxes_cmd.rented_table(row)  # noqa: E731
    # one row: fold it all the same, and never cut its label
    narrow = render(make, 80)
    assert_every_cell_in(make(), narrow)
    assert lines_of(narrow)[2] == VALIDATOR_R2 and not set(FRAME) & set(narrow)
    assert "ssh:      194.68.245.12:22105" in narrow
    assert render(make, 200) == rich_render(make, 200)


def _health() -> list[Health]:
    return [
        Health(label=VALIDATOR, provider="vast", ssh=True, agent=True, synced=True,
               blocks=1843211, exec_tip=1843209, exec_moving=True, prover="ready",
               admitted=True, node_sha16="3f9c2a7b1e0d4c58", wanted_sha16="3f9c2a7b1e0d4c58"),
        Health(label=VALIDATOR_R2, provider="runpod",
               problems=["SSH did not answer within 10 s"]),
    ]


def test_check_standing_boxes() -> None:
    results = _health()
    assert_folds_at_80_and_is_whole_at(lambda: check_cmd.standing_table(results))


def test_check_with_no_standing_box_says_so() -> None:
    text = render(lambda: check_cmd.standing_table([]), 80)
    assert "no standing boxes in the inventory" in text and "…" not in text


def test_check_watchdog() -> None:
    watched = [
        Watch(label=BENCH, job="gemm-sweep", phase="finished", age_min=63.4, ttl_left_min=56.6,
              problems=[f"job finished, box still billing: fleet teardown {BENCH}"]),
        Watch(label=BENCH_VAST, job="attn-fp8", phase="running", age_min=12.0,
              ttl_left_min=None),
    ]
    assert_folds_at_80_and_is_whole_at(lambda: check_cmd.watchdog_table(watched))


def _release(version: str) -> releases.Release:
    sha = {n: hashlib.sha256(f"{n} {version}".encode()).hexdigest() for n in releases.FILES}
    return releases.Release(version=version, path=Path(f"/var/lib/fleet/releases/{version}"),
                            sha256=sha, sizes={releases.NODE_BINARY: 48213504,
                                               releases.MINER_BINARY: 9437184,
                                               releases.PROVER_BINARY: 31457280})


def _readback(rel: releases.Release, old: releases.Release) -> dict[str, Any]:
    path = f"/root/fleet/releases/{rel.node_sha16}/igneumd"
    return {
        "node": {"pid": 4121, "exe_kind": "elf", "path": path, "sha256": rel.node_sha256,
                 "started_at": "2026-12-02T10:00:05Z", "version": rel.version, "synced": True},
        "miner": {"pid": 4122, "exe_kind": "elf", "sha256": rel.sha256[releases.MINER_BINARY]},
        "prover": {"pid": 4123, "exe_kind": "elf", "sha256": rel.sha256[releases.PROVER_BINARY]},
        "pointer": {"target": path, "sha256": rel.node_sha256,
                    "target_sha256": rel.node_sha256, "written_at": "2026-12-02T10:00:00Z"},
        "started_after_pointer": True,
        "switch": {"from_sha16": old.node_sha16, "to_sha16": rel.node_sha16,
                   "applied_at": "2026-12-02T10:00:00Z", "old_exit_at": "2026-12-02T10:00:01Z",
                   "new_started_at": "2026-12-02T10:00:02Z",
                   "synced_at": "2026-12-02T10:00:03.5Z", "downtime_s": 2.5},
    }


def test_publish() -> None:
    old, new = _release("1.4.0"), _release("1.5.0")
    known = [old, new]
    rows = [pub.table_row(VALIDATOR, "vast", "switched", "", _readback(new, old), new, known),
            pub.table_row(VALIDATOR_R2, "runpod", "unreachable",
                          "SSH did not answer within 10 s", None, new, known)]
    make = lambda: publish_cmd.publish_table(  # noqa: E731
        new, rows, False, "1 box switched now; record /var/lib/fleet/releases/1.5.0/publish.json")
    # eleven columns of realistic cells (a 42-character label, a note) are wider than 200
    # columns too: folded there as well, whole where the terminal is wide enough for them
    assert tables.natural_width(Console(width=80), make()) > 200
    assert not set(FRAME) & set(render(make, 200))
    assert_folds_at_80_and_is_whole_at(make, wide=300)


def test_release_list() -> None:
    old, new = _release("1.4.0"), _release("1.5.0")
    rows = [publish_cmd.release_row(old, [], {"outcome": "done",
                                              "updated_at": "2026-11-28T09:14:02Z"}),
            publish_cmd.release_row(new, ["igneum-prover: sha256 differs from the manifest"], {})]
    assert_folds_at_80_and_is_whole_at(
        lambda: publish_cmd.releases_table(Path("/var/lib/fleet/releases"), rows))


def test_teardown() -> None:
    results = [
        Outcome(label=BENCH, job="gemm-sweep", phase="finished", files=14, bytes=73400320,
                commit="9f2c4e1a7b3d5c6e8f0a", destroyed=True),
        Outcome(label=BENCH_VAST, job="attn-fp8", phase="failed", files=2, bytes=18231,
                steps=["outputs archived", "store commit refused: SSH did not answer within "
                       "10 s", "box kept"]),
    ]
    assert_folds_at_80_and_is_whole_at(lambda: oneshot_cmd.teardown_table(results, False, None))


def test_run_job_table_has_no_key_column_and_folds_to_what_value_lines() -> None:
    s = Summary(label=BENCH, provider="runpod", card="H100 SXM", usd_per_hour=2.69,
                job="gemm-sweep", phase="failed", admission="gpu: driver 580.95.05 admitted",
                invocations=1, exit_code=137,
                toolchain={"repo": "fleet/toolchains", "revision": "4d9e2b7c1a0f8e6d",
                           "warm": False, "bytes_fetched": 812646400},
                gates=[{"name": "smoke", "exit_code": 0, "passed": 12}],
                outputs_files=3, outputs_bytes=91234,
                kept="outputs not verified: 2 files differ from the box's manifest",
                problem="SSH did not answer within 10 s after the job ended; the outputs were "
                        "read back from the store copy only", cost_usd=0.0872)
    make = lambda: oneshot_cmd.job_table(s)  # noqa: E731
    table, narrow, whole = make(), render(make, 80), render(make, 200)
    assert_every_cell_in(table, narrow)
    assert_every_cell_in(table, whole)
    assert not set(FRAME) & set(narrow) and all(len(x) <= 80 for x in lines_of(narrow))
    for what, value in cells(table):
        assert any(line.startswith(f"{what}:") for line in lines_of(narrow)), (what, narrow)
        assert flat(f"{what}: {value}") in flat(narrow)
    assert whole == rich_render(make, 200)
    for what, value in cells(table):
        assert any(what in line and value in line for line in lines_of(whole)), whole


# --- the rule itself ------------------------------------------------------------------------

def _two_rows() -> Table:
    return tables.build("boxes", ("label", "status", "problem"), [
        {"label": VALIDATOR_R2, "status": "running", "problem": "SSH did not answer within 10 s"},
        {"label": BENCH, "status": "exited"}])


def test_a_table_folds_exactly_when_its_natural_width_is_wider_than_the_console() -> None:
    width = tables.natural_width(Console(width=80), _two_rows())
    assert set(FRAME) & set(render(_two_rows, width))
    assert render(_two_rows, width) == rich_render(_two_rows, width)
    folded = render(_two_rows, width - 1)
    assert not set(FRAME) & set(folded) and "…" not in folded
    assert lines_of(folded)[2] == VALIDATOR_R2


def test_a_label_wider_than_the_console_is_printed_whole_on_its_line() -> None:
    folded = render(_two_rows, 30)
    assert VALIDATOR_R2 in lines_of(folded) and len(VALIDATOR_R2) > 30
    assert "problem: SSH did" in folded and "…" not in folded
    assert flat("SSH did not answer within 10 s") in flat(folded)


def test_a_cell_a_row_leaves_out_reads_a_dash_and_an_unknown_column_is_refused() -> None:
    assert cells(_two_rows())[1] == [BENCH, "exited", "-"]
    with pytest.raises(ValueError, match="machine"):
        tables.build("roster", ("label",), [{"label": BENCH, "machine": "vast machine 12345"}])


def test_an_empty_cell_is_left_out_of_its_block() -> None:
    t = lambda: tables.build("offers", ("provider", "offer", "cuda", "where"),  # noqa: E731
                             [{"provider": "vast", "offer": "28764310" * 8, "cuda": "",
                               "where": "Norway"}])
    folded = render(t, 80)
    assert "  where: Norway" in folded and "cuda" not in folded


# --- emit: every command's table, --json untouched ------------------------------------------

@pytest.mark.parametrize("width, framed", [(80, False), (240, True)])
def test_emit_prints_the_table_for_the_console_width(monkeypatch: pytest.MonkeyPatch,
                                                     width: int, framed: bool) -> None:
    rows, caption = _roster_rows()
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    monkeypatch.setattr(common, "out", console)
    common.emit(boxes_cmd.roster_table(rows, caption), {"boxes": []}, False)
    text = console.export_text()
    assert bool(set(FRAME) & set(text)) is framed
    assert VALIDATOR_R2 in lines_of(text) or framed


def test_emit_json_is_the_data_whatever_the_width(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    rows, caption = _roster_rows()
    data: dict[str, Any] = {"boxes": [r.to_dict() for r in _registry_rows()], "when": NOW}
    monkeypatch.setattr(common, "out", Console(width=80, file=io.StringIO()))
    common.emit(boxes_cmd.roster_table(rows, caption), data, True)
    assert capsys.readouterr().out == json.dumps(data, indent=1, default=str) + "\n"


PAGE_CONFIG = """
[fleet]
registry = "state/boxes.json"
daily_budget_usd = 50
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
"""


def _fleet_page(tmp_path: Path, columns: int) -> str:
    """`fleet page` run for real in a terminal `columns` wide (no live box: no provider)."""
    (tmp_path / "fleet.toml").write_text(PAGE_CONFIG)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RUNPOD_", "VAST_", "FLEET_", "HF_"))}
    env.update(FLEET_CONFIG=str(tmp_path / "fleet.toml"), HOME=str(tmp_path),
               COLUMNS=str(columns))
    r = subprocess.run([sys.executable, "-m", "fleet.cli", "page"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_fleet_page_folds_through_emit(tmp_path: Path) -> None:
    narrow, whole = _fleet_page(tmp_path, 80), _fleet_page(tmp_path, 200)
    headers: Sequence[str] = ("USD/h", "USD/day", "standing", "down", "problem", "unknown",
                              "well", "owed", "spent today", "budget")
    assert not set(FRAME) & set(narrow) and "…" not in narrow
    assert all(len(line) <= 80 for line in lines_of(narrow))
    blank = lines_of(narrow).index("")
    assert lines_of(narrow)[blank + 1] == "0"  # the key: how many boxes
    for h in headers:
        assert any(line.startswith(f"  {h}:") for line in lines_of(narrow)), (h, narrow)
    assert "budget:      $50.00" in narrow and "USD/h:       0.000" in narrow
    assert set(FRAME) & set(whole)
    assert any(all(h in line for h in headers) for line in lines_of(whole)), whole


def test_a_table_with_no_row_folds_to_its_title_and_caption() -> None:
    text = render(lambda: publish_cmd.releases_table(Path("/var/lib/fleet/releases"), []), 80)
    assert lines_of(text) == ["releases in /var/lib/fleet/releases", "",
                              "no releases yet: fleet release add DIR --version V"]
