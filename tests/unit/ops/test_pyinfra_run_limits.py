"""How long each pyinfra run may take. A publish wave is bounded, but never below what one
box's switch may legitimately take: `agent switch` waits for another switch's lock, then
`deadline_s` for the new node, then, where it failed, `deadline_s` more for the revert."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.commands.switch import LOCK_WAIT_S
from fleet.core.config import parse
from fleet.ops import publish as pub
from fleet.state import releases

CONFIG = {"fleet": {"registry": "state/boxes.json"},
          "loop": {"converge_timeout_s": 120},
          "roles": {"live": {"kind": "standing", "image": "img", "disk_gb": 20,
                             "admitted_driver": "580.95.05"}}}


class _Ran(Exception):
    pass


def test_a_waves_timeout_covers_a_switch_that_waits_for_the_lock_and_reverts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = parse(CONFIG, tmp_path / "fleet.toml")
    release = releases.Release("2.0.0", tmp_path, {releases.NODE_BINARY: "a" * 64})
    opts = pub.Options("2.0.0", stable_s=60, deadline_s=900)
    seen: dict[str, Any] = {}

    def fake(cfg_: Any, labels: Sequence[str], data: Mapping[str, str] | None = None,
             **kw: Any) -> Any:
        seen.update(kw)
        raise _Ran

    monkeypatch.setattr(pub, "run_pyinfra", fake)
    monkeypatch.setattr(pub, "_want", lambda *a: None)
    p = pub._Publish.__new__(pub._Publish)
    p.cfg, p.opts, p.release, p.known = cfg, opts, release, [release]
    p.record = pub.Record.load(tmp_path / pub.RECORD, "2.0.0", release.node_sha16)
    p.downgrade, p.rows = set(), {}
    with pytest.raises(_Ran):
        p.wave(1, [["box-a"]], pub.Result(release, p.record, []))
    # the switch's own worst case: the lock, its deadline, the revert's deadline
    assert seen["timeout_s"] >= LOCK_WAIT_S + 2 * opts.deadline_s


def test_staging_waits_for_every_upload_however_long_it_takes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release uploaded to every pending box at once takes what the uplink allows: no
    limit, as before the runs had one runner (a person watches the publish)."""
    cfg = parse(CONFIG, tmp_path / "fleet.toml")
    release = releases.Release("2.0.0", tmp_path, {releases.NODE_BINARY: "a" * 64})
    seen: dict[str, Any] = {}

    def fake(cfg_: Any, labels: Sequence[str], data: Mapping[str, str] | None = None,
             **kw: Any) -> Any:
        seen.update(kw)
        raise _Ran

    monkeypatch.setattr(pub, "run_pyinfra", fake)
    p = pub._Publish.__new__(pub._Publish)
    p.cfg, p.release, p.pending = cfg, release, ["box-a", "box-b"]
    with pytest.raises(_Ran):
        p.stage()
    assert seen.get("timeout_s") is None


def test_a_converge_of_every_standing_box_waits_as_long_as_it_takes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fleet converge standing` runs over every box at once with a person watching: no
    limit (the loop's converges of a few boxes are bounded by `converge_timeout_s`)."""
    from fleet.boxes import pyinfra_run
    from fleet.ops import converge

    cfg = parse(CONFIG, tmp_path / "fleet.toml")
    seen: dict[str, Any] = {}

    def fake(cfg_: Any, labels: Sequence[str], data: Mapping[str, str] | None = None,
             **kw: Any) -> Any:
        seen.update(kw)
        raise _Ran

    monkeypatch.setattr(pyinfra_run, "run_pyinfra", fake)
    with pytest.raises(_Ran):
        converge.converge_all(cfg)
    assert "timeout_s" in seen and seen["timeout_s"] is None
