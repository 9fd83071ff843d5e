"""The folded tables: no character of a value cropped at any width, and Rich markup in a cell
printed as text, never read as a style, a closing tag or an emoji."""
from __future__ import annotations

import io

import pytest
import test_tables as T
from rich.console import Console

from fleet.cli import boxes_cmd, check_cmd, publish_cmd, tables
from fleet.core.verdicts import Health
from fleet.ops import publish as pub
from fleet.providers.base import Box


def nows(s: str) -> str:
    return "".join(s.split())


def _publish():
    old, new = T._release("1.4.0"), T._release("1.5.0")
    rows = [pub.table_row(T.VALIDATOR, "vast", "switched", "", T._readback(new, old), new,
                          [old, new]),
            pub.table_row(T.VALIDATOR_R2, "runpod", "unreachable",
                          "SSH did not answer within 10 s", None, new, [old, new])]
    return lambda: publish_cmd.publish_table(new, rows, False, "cap")


def _roster():
    rows = T._roster_rows()  # once: an uptime reads the clock, and both reads must see one
    return lambda: boxes_cmd.roster_table(*rows)


@pytest.mark.parametrize("name, make, width", [
    ("publish", _publish(), 50),                                   # a 50-column pane
    ("check", lambda: check_cmd.standing_table(T._health()), 27),
    ("roster", _roster(), 20),
])
def test_a_folded_table_never_crops_a_character(name, make, width) -> None:
    text = T.render(make, width)
    lost = [c for row in T.cells(make()) for c in row if nows(c) not in nows(text)]
    assert not lost, (lost, text)   # no folded line cropped by a column


def _render(t, width):
    c = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    tables.show(c, t)
    return c.export_text()


@pytest.mark.parametrize("width", [200, 40])
def test_brackets_in_a_problem_are_printed_not_read_as_markup(width) -> None:
    h = [Health("live-a", "vast", ssh=True, agent=True,
                problems=["admission refused: gpu [nvidia-smi] failed"])]
    text = _render(check_cmd.standing_table(h), width)
    assert "[nvidia-smi]" in text, text  # never taken for a style and dropped


@pytest.mark.parametrize("width", [200, 40])
def test_an_orphans_provider_label_with_a_closing_bracket_does_not_crash_the_roster(width):
    rows = [boxes_cmd.orphan_row(Box(provider="vast", box_id="1", label="scratch [/tmp]",
                                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3,
                                     status="running"))]
    text = _render(boxes_cmd.roster_table(rows, "cap"), width)  # no MarkupError
    assert "scratch [/tmp]" in text


def test_an_emoji_code_in_a_label_stays_as_written() -> None:
    rows = [boxes_cmd.orphan_row(Box(provider="vast", box_id="1", label="gpu:fire:test",
                                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3,
                                     status="running"))]
    assert "gpu:fire:test" in _render(boxes_cmd.roster_table(rows, "cap"), 200)
