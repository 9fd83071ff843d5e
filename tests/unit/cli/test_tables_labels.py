"""What the operator reads in a terminal: every command's title and table at 80 and at 200
columns with each box's label whole on one line (never broken across two), no line ending in
a space, and a value not known printed as `?`: never Python's `None`, never a verdict it is
not (a box whose sshd hangs has no refused admission and no agent down, as far as anyone
knows)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import test_tables as T
from rich.table import Table

from fleet.cli import boxes_cmd, check_cmd, mesh_cmd, oneshot_cmd, publish_cmd, tables
from fleet.cli.storage_cmd import clean_table, review_table
from fleet.core.verdicts import Health, Watch
from fleet.ops import check as check_ops
from fleet.ops import publish as pub
from fleet.ops.oneshot import Summary
from fleet.ops.teardown import Outcome

SHORT = "live-rp-4090-0007"
MATE = "live-rp-4090-0008"
LONG = T.VALIDATOR_R2  # 42 characters: a 20-character role, re-rented
LABELS = (SHORT, MATE, LONG)


def _peers(label: str, cell: str, peers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"label": label, "cell": cell, "peers": peers}


MESH = [
    _peers(SHORT, "3/2 star-only owed a port", [
        {"dir": "in", "remote": "203.0.113.45:30303", "box": MATE},
        {"dir": "out", "remote": "194.68.245.12:30303", "box": LONG},
        {"dir": "in", "remote": "198.51.100.7:30303", "box": None}]),
    _peers(LONG, "?/? star-only owed a port", []),  # a hung box: nothing reported
    _peers(MATE, "0/1", [{"dir": "out", "remote": "203.0.113.9:30303", "box": SHORT}]),
]

REVIEW = {"categories": [
    {"name": "releases (old)", "regenerable": True, "bytes": 3 * 48213504, "files": 9,
     "oldest": 1.7e9},
    {"name": "outputs", "regenerable": False, "bytes": 73400320, "files": 14,
     "oldest": 1.71e9}],
    "disk": {"free_bytes": 9 * 2**30, "total_bytes": 40 * 2**30},
    "freeable_bytes": 3 * 48213504, "free_after_bytes": 9 * 2**30 + 3 * 48213504}
CLEANED = {"categories": {"releases (old)": {"promised": 3 * 48213504,
                                              "freed": 2 * 48213504, "files": 6}},
           "dry_run": False, "free_before_bytes": 9 * 2**30,
           "free_after_bytes": 9 * 2**30 + 2 * 48213504}


def hung(label: str = SHORT) -> Health:
    """What `fleet check` knows of a box whose sshd took the login and then hung: its label,
    that it did not answer, and nothing else (`fleet.ops.check.judge` with no status)."""
    h = check_ops.judge(label, {"provider": "vast"}, None, None, None)
    h.hung = True
    return h


def _standing() -> list[Health]:
    well = Health(SHORT, "vast", ssh=True, agent=True, synced=True, blocks=1843211,
                  exec_tip=1843209, exec_moving=True, prover="ready", admitted=True,
                  node_sha16="3f9c2a7b1e0d4c58", wanted_sha16="3f9c2a7b1e0d4c58",
                  peers_in=3, peers_out=2)
    return [well, hung(MATE), hung(LONG)]


def _publish() -> Table:
    old, new = T._release("1.4.0"), T._release("1.5.0")
    rows = [pub.table_row(label, "vast", "switched", "", T._readback(new, old), new,
                          [old, new]) for label in (SHORT, MATE)]
    rows.append(pub.table_row(LONG, "runpod", "unreachable", "SSH did not answer within 10 s",
                              None, new, [old, new]))
    return publish_cmd.publish_table(new, rows, False, "2 boxes switched now")


TABLES: dict[str, Callable[[], list[Table]]] = {
    "check": lambda: [check_cmd.standing_table(_standing())],
    "check watchdog": lambda: [check_cmd.watchdog_table([
        Watch(label=SHORT, job="gemm-sweep", phase="finished", age_min=63.4,
              ttl_left_min=None, problems=[f"job finished, box still billing: fleet "
                                           f"teardown {SHORT}"]),
        Watch(label=LONG, job="attn", phase="running", age_min=2.0, ttl_left_min=28.0)])],
    "mesh": lambda: [mesh_cmd.peer_table(box) for box in MESH],
    "storage review": lambda: [review_table(label, REVIEW) for label in LABELS],
    "storage clean": lambda: [clean_table(label, CLEANED) for label in LABELS],
    "roster": lambda: [boxes_cmd.roster_table(*T._roster_rows())],
    "publish": lambda: [_publish()],
    "rented": lambda: [boxes_cmd.rented_table(row) for row in T._registry_rows()],
    "run job": lambda: [oneshot_cmd.job_table(Summary(
        label=LONG, provider="runpod", card="H100 SXM", usd_per_hour=2.69, job="gemm-sweep",
        phase="failed", admission=None, invocations=None, exit_code=None,
        problem=f"SSH to {LONG} did not answer within 10 s"))],
    "teardown": lambda: [oneshot_cmd.teardown_table([
        Outcome(label=SHORT, job="gemm", phase="finished", files=3, bytes=91234,
                commit="9f2c4e1a7b3d", destroyed=True),
        Outcome(label=LONG, job="gemm", phase="failed", files=0, bytes=0,
                steps=["SSH did not answer within 10 s", "box kept"])], False, None)],
}


def render(name: str, width: int) -> list[str]:
    """The lines `tables.show` prints for each of the command's tables at `width` columns."""
    text = "".join(T.render(lambda t=t: t, width) for t in TABLES[name]())
    return text.splitlines()


def labels_in(name: str) -> set[str]:
    """The labels the command's tables carry, in their cells or titles."""
    text = "\n".join(T.flat(T.plain(t.title)) + "\n" + "\n".join(" ".join(r) for r in
                                                                  T.cells(t))
                     for t in TABLES[name]())
    return {label for label in (*LABELS, T.VALIDATOR, T.BENCH, T.BENCH_VAST) if label in text}


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_label_is_whole_on_one_line(name: str, width: int) -> None:
    lines = render(name, width)
    labels = labels_in(name)
    assert labels, name
    for label in labels:
        assert any(label in line for line in lines), (label, "\n".join(lines))
        head = label[: len(label) // 2]
        for line in lines:  # a line with the label's first half has the rest of it too
            if line.rstrip().endswith(head):
                assert label in line, (label, "\n".join(lines))
    if width == 80:
        assert all(len(line) <= 80 for line in lines), "\n".join(lines)


@pytest.mark.parametrize("name, width", [(name, width) for name in sorted(TABLES)
                                         for width in (80, 200)])
def test_no_line_ends_in_a_space(name: str, width: int) -> None:
    lines = render(name, width)
    assert [line for line in lines if line != line.rstrip()] == [], "\n".join(lines)


def test_a_job_that_could_not_be_read_shows_unknown_admission_and_invocations() -> None:
    lines = render("run job", 200)
    assert any(line.split() == ["│", "admission", "│", "?", "│"] for line in lines), lines
    assert any(line.split() == ["│", "invocations", "│", "?", "│"] for line in lines), lines


def test_a_mesh_title_wider_than_its_table_is_one_line_above_it() -> None:
    lines = render("mesh", 200)
    assert f"{LONG}: in/out ?/? star-only owed a port" in lines
    assert f"{SHORT}: in/out 3/2 star-only owed a port" in lines


def test_a_storage_caption_wider_than_its_table_is_one_line_below_it() -> None:
    lines = render("storage review", 200)
    caption = T.plain(review_table(SHORT, REVIEW).caption)
    assert lines.count(caption) == 3


def test_a_folded_block_keeps_no_padding_after_a_wrapped_value() -> None:
    t = tables.build("boxes", ("label", "problem"), [
        {"label": SHORT, "problem": "SSH did not answer within 10 s; " * 6}])
    lines = T.render(lambda: t, 50).splitlines()
    assert len(lines) > 4 and all(line == line.rstrip() for line in lines), lines


# --- unknown is `?` -------------------------------------------------------------------------

def test_a_hung_box_s_check_row_is_unknown_not_refused_or_down() -> None:
    row = check_cmd.standing_row(hung())
    assert row["ssh"] == "hung" and row["verdict"] == "ssh: box did not answer"
    for column in ("agent", "synced", "blocks", "exec tip", "prover", "admission", "node"):
        assert row[column] == "?", (column, row)
    assert row["peers in/out"] == "?/?"
    for width in (80, 200):
        text = "\n".join(render("check", width))
        assert "None" not in text and "refused" not in text, text


def test_a_box_that_answered_without_an_admission_reads_unknown() -> None:
    h = Health(SHORT, "vast", ssh=True, agent=True, problems=["node: no RPC (None)"])
    row = check_cmd.standing_row(h)
    assert (row["synced"], row["blocks"], row["admission"]) == ("?", "?", "?")
    assert row["agent"] == "up"


@pytest.mark.parametrize("admitted, reason, cell", [
    (True, None, "ok"), (False, "driver 575.0.0", "refused: driver 575.0.0"),
    (False, None, "refused: ?"), (None, None, "?"), (None, "stale", "?")])
def test_admission_reads_ok_refused_or_unknown(admitted: bool | None, reason: str | None,
                                               cell: str) -> None:
    assert check_cmd.admission(admitted, reason) == cell


def test_a_cell_of_none_is_unknown_in_every_built_table() -> None:
    t = tables.build("boxes", ("label", "synced", "blocks"),
                     [{"label": SHORT, "synced": None, "blocks": "12"}])
    assert T.cells(t) == [[SHORT, "?", "12"]]
    assert tables.known(None) == "?" and tables.known(False) == "False"
    assert tables.known(0) == "0"


def test_a_table_shown_keeps_its_title_and_caption() -> None:
    t = mesh_cmd.peer_table(MESH[1])
    title, caption = t.title, t.caption
    T.render(lambda: t, 200)
    assert (t.title, t.caption) == (title, caption)
