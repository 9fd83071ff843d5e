"""The README's examples as an 80-column terminal shows them: every drawn output no wider
than 80 columns, and `fleet publish`'s table the very text the CLI prints at COLUMNS=80 for
the example's boxes. Commands and fleet.toml examples (```sh, ```toml) are what a reader
copies, comments included: up to 100 columns."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from repo_root import ROOT
from rich.console import Console

from fleet.cli import publish_cmd, tables
from fleet.ops import publish as pub
from fleet.state import releases

README = ROOT / "README.md"
OUTPUT, SOURCE = 80, 100  # columns: a drawn output, a command or config to copy
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks() -> list[tuple[str, list[str]]]:
    """Each fenced block of the README: its language (empty: a drawn output) and lines."""
    return [(m[1], m[2].splitlines()) for m in FENCE.finditer(README.read_text())]


def test_every_drawn_output_fits_80_columns_and_every_command_100() -> None:
    found = blocks()
    assert sum(1 for lang, _ in found if not lang) >= 3  # roster, publish, run
    for lang, lines in found:
        limit = OUTPUT if not lang else SOURCE
        wide = [line for line in lines if len(line) > limit]
        assert not wide, (lang, limit, wide)


def test_no_drawn_output_line_ends_in_a_space() -> None:
    for lang, lines in blocks():
        if not lang:
            assert [line for line in lines if line != line.rstrip()] == [], lines


# --- fleet publish: the example's four boxes, the first two drawn -----------------------------

def _release(version: str, node: str, miner: str, prover: str) -> releases.Release:
    sha = {releases.NODE_BINARY: node.ljust(64, "0"), releases.MINER_BINARY: miner.ljust(64, "0"),
           releases.PROVER_BINARY: prover.ljust(64, "0")}
    return releases.Release(version=version, path=Path(f"state/releases/{version}"),
                            sha256=sha, sizes=dict.fromkeys(sha, 1000))


OLD = _release("1.4.0", "9d1e4be02c7a6f35", "a28e25a9ac7538e1", "94c0af6f19ce382c")
NEW = _release("1.5.0", "406034c0f0cbd22b", "5b0c7e91d4f2a638", "c81f03a6e9b4d257")
CAPTION = "4 boxes switched now; record state/releases/1.5.0/publish.json"
COMMAND = "$ fleet publish 1.5.0 --canary live-runpod-76e17d --stable-s 2 --deadline-s 60"


def _readback(synced_at: str, downtime_s: float) -> dict[str, Any]:
    path = f"releases/{NEW.node_sha16}/igneumd"
    return {
        "node": {"pid": 4121, "exe_kind": "script", "path": path, "sha256": NEW.node_sha256,
                 "started_at": "2026-12-02T10:00:01.01Z", "version": "1.5.0", "synced": True},
        "miner": {"pid": 4122, "exe_kind": "elf", "sha256": OLD.sha256[releases.MINER_BINARY]},
        "prover": {"pid": 4123, "exe_kind": "elf", "sha256": OLD.sha256[releases.PROVER_BINARY]},
        "pointer": {"target": path, "sha256": NEW.node_sha256,
                    "target_sha256": NEW.node_sha256, "written_at": "2026-12-02T10:00:00Z"},
        "started_after_pointer": True,
        "switch": {"from_sha16": OLD.node_sha16, "to_sha16": NEW.node_sha16,
                   "applied_at": "2026-12-02T10:00:00Z", "old_exit_at": "2026-12-02T10:00:01Z",
                   "new_started_at": "2026-12-02T10:00:01.01Z", "synced_at": synced_at,
                   "downtime_s": downtime_s},
    }


def publish_drawing() -> list[str]:
    """What `fleet publish` prints at 80 columns for the example's first two boxes."""
    rows = [pub.table_row("live-runpod-76e17d", "runpod", "switched", "",
                          _readback("2026-12-02T10:00:00.36Z", 0.28), NEW, [OLD, NEW]),
            pub.table_row("live-runpod-f7b8dd", "runpod", "switched", "",
                          _readback("2026-12-02T10:00:00.70Z", 0.55), NEW, [OLD, NEW])]
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    tables.show(console, publish_cmd.publish_table(NEW, rows, False, CAPTION))
    return [COMMAND, *console.export_text().splitlines()]


def test_the_publish_example_is_what_the_cli_prints_at_80_columns() -> None:
    drawn = [lines for lang, lines in blocks() if not lang and lines[:1] == [COMMAND]]
    assert drawn == [publish_drawing()], "\n".join(publish_drawing())
