"""What `fleet teardown` refuses before it touches a box or a provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.core.boxes import Row
from fleet.core.config import parse
from fleet.core.errors import UsageError
from fleet.ops import teardown
from fleet.state.registry import Registry

CONFIG = {
    "fleet": {"registry": "state/boxes.json"},
    "roles": {
        "live": {"kind": "standing", "image": "img", "disk_gb": 20, "programs": ["node"],
                 "admitted_driver": "580.95.05"},
        "bench": {"kind": "oneshot", "image": "img", "disk_gb": 20,
                  "admitted_driver": "580.95.05"},
    },
}


class NoProvider:
    """Any call is a failure of the test: the guards come first."""

    name = "vast"

    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"the provider was asked ({name}) before the guards")


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    r = Registry(tmp_path / "state" / "boxes.json")
    for label, role, kind, standing in (("live-1", "live", "standing", True),
                                        ("live-2", "live", "standing", False),
                                        ("bench-1", "bench", "oneshot", False)):
        r.add(Row(label=label, provider="vast", role=role, kind=kind, card="RTX 4090",
                  gpu_count=1, usd_per_hour=0.4, status="running", standing=standing))
    r.mark_destroyed("bench-1")
    return r


@pytest.mark.parametrize(("label", "says"), [
    ("live-1", "live-1 is a standing box"),
    ("live-2", "live-2 is a standing box"),  # a standing role's box, not converted yet
    ("bench-1", "bench-1 is already destroyed"),
    ("nobody", "no box labelled 'nobody'"),
])
def test_refused_before_any_box_or_provider_is_asked(tmp_path: Path, reg: Registry,
                                                     label: str, says: str) -> None:
    cfg = parse(CONFIG, tmp_path / "fleet.toml")
    with pytest.raises(UsageError, match=says):
        teardown.teardown(cfg, reg, {"vast": NoProvider()}, label)  # type: ignore[dict-item]
