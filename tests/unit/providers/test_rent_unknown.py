"""Never rent twice on an unknown outcome: a rent whose create may have landed keeps its row
unfinished (`renting`, its label looked up again later) and tries no further offer under a
new label; only a create the provider definitely refused marks its row failed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from provider_fakes import FakeVast, make_http

from fleet.boxes import lifecycle
from fleet.boxes.sshkeys import ensure_key
from fleet.core.boxes import unfinished
from fleet.core.config import Config, Role
from fleet.core.errors import (
    OfferGone,
    OutcomeUnknown,
    ProviderError,
    RentOutcomeUnknown,
    UsageError,
)
from fleet.ops import rent
from fleet.providers.base import Box, Offer, RentRequest
from fleet.providers.vast import Vast
from fleet.state.registry import Registry

OFFERS = [Offer("vast", "501", "RTX 4090", 1, 0.41), Offer("vast", "502", "RTX 4090", 1, 0.38)]
EMPTY = httpx.Response(200, json={"success": True, "instances": [], "next_token": None})
GONE = httpx.Response(404, json={"success": False, "error": "no_such_ask", "msg": "taken"})


def make_cfg(tmp_path: Path) -> Config:
    return Config(path=tmp_path / "fleet.toml", registry=tmp_path / "boxes.json",
                  known_hosts=tmp_path / "known_hosts", ssh_key=ensure_key(tmp_path / "key"),
                  releases=tmp_path / "releases", daily_budget_usd=100.0,
                  roles={"bench": Role("bench", "oneshot", "img", 20)}, roster=())


def test_a_create_lost_then_refused_keeps_its_row_unfinished_and_rents_nothing_else(
        tmp_path: Path) -> None:
    cfg, fake = make_cfg(tmp_path), FakeVast()
    client = Vast(make_http("vast", fake), destroy_polls=4, poll_interval=1.0)
    # the create lands, its answer is lost; no lookup sees it (a lagging listing); the retry
    # is refused because the first create took the machine
    fake.queue("create", ("after", httpx.ReadTimeout("timed out")), ("before", GONE))
    fake.queue("list", ("before", None), *[("before", EMPTY)] * 3)
    reg = Registry(cfg.registry)
    with pytest.raises(RentOutcomeUnknown):
        rent.rent(cfg, reg, cfg.role("bench"), OFFERS, {"vast": client}, label="bench-u-1",
                  account=[])  # the account as listed before: the queued lists are the rent's
    (row,) = reg.rows()  # no second offer under a new label
    assert row.status == "renting" and row.destroyed_at is None and unfinished(row)
    assert "outcome unknown" in (row.note or "") and "looked up again" in (row.note or "")
    assert len(fake.instances) == 1  # the one box, billing: the loop finds it by its label
    found = lifecycle.find_unfinished(client, row)
    assert found is not None and found.label == "bench-u-1"


class Raising:
    """A provider whose create fails with `error`, and whose listing shows no box."""

    name = "vast"

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.rents: list[str] = []

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        self.rents.append(offer.offer_id)
        if len(self.rents) == 1:
            raise self.error
        return Box("vast", "9", req.label, offer.card, 1, offer.usd_per_hour, "provisioning")

    def find_by_label(self, label: str) -> Box | None:
        return None

    def box(self, box_id: str) -> Box | None:
        return None

    def boxes(self) -> list[Box]:
        return []


def refused_4xx() -> ProviderError:
    e = ProviderError("vast", "PUT /api/v0/asks/{id}/", "HTTP 400: invalid image")
    e.refused = True
    return e


@pytest.mark.parametrize("error", [
    RentOutcomeUnknown("vast", "rent", "no box labelled bench-u-2 after 5 tries"),
    OutcomeUnknown("vast", "PUT /api/v0/asks/{id}/", "no answer (ReadTimeout)"),
    ProviderError("vast", "PUT /api/v0/asks/{id}/", "HTTP 200, not JSON: <html>"),
    RuntimeError("a bug while reading the answer"),
    KeyboardInterrupt(),
], ids=lambda e: type(e).__name__)
def test_an_unknown_outcome_leaves_the_row_unfinished(tmp_path: Path,
                                                      error: BaseException) -> None:
    cfg, p = make_cfg(tmp_path), Raising(error)
    reg = Registry(cfg.registry)
    with pytest.raises(type(error)):
        rent.rent(cfg, reg, cfg.role("bench"), OFFERS, {"vast": p},  # type: ignore[dict-item]
                  label="bench-u-2")
    (row,) = reg.rows()
    assert row.status == "renting" and row.destroyed_at is None
    assert "outcome unknown" in (row.note or "") and p.rents == ["501"]


@pytest.mark.parametrize("error, next_offer", [
    (OfferGone("vast", "PUT /api/v0/asks/{id}/", "HTTP 404: no_such_ask"), True),
    (refused_4xx(), False),
    (UsageError("bad label"), False),
], ids=["offer-gone", "http-400", "usage"])
def test_a_definite_refusal_marks_the_row_failed(tmp_path: Path, error: BaseException,
                                                 next_offer: bool) -> None:
    cfg, p = make_cfg(tmp_path), Raising(error)
    reg = Registry(cfg.registry)
    if next_offer:
        out = rent.rent(cfg, reg, cfg.role("bench"), OFFERS, {"vast": p},  # type: ignore[dict-item]
                        label="bench-u-3")
        assert out.row.provider_id == "9" and p.rents == ["501", "502"]
    else:
        with pytest.raises(type(error)):
            rent.rent(cfg, reg, cfg.role("bench"), OFFERS, {"vast": p},  # type: ignore[dict-item]
                      label="bench-u-3")
    first = reg.get("bench-u-3")
    assert first is not None and first.status == "failed" and first.destroyed_at
