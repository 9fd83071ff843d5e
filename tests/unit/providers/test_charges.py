"""Both clients' `charges` against the sandbox's fake billing endpoints on loopback: the
amounts the ledger charged, Vast's paging, RunPod's billing lag and buckets, retries of a 5xx,
a 5xx storm and a 429 storm given up on with a typed error, a bad key."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from fleet.core.errors import AuthFailed, ProviderError, RateLimited
from fleet.providers import vast as vast_mod
from fleet.providers.base import RentRequest
from fleet.providers.factory import get_provider
from fleet.providers.http import RetryPolicy
from fleet.providers.runpod import RunPod
from fleet.providers.vast import Vast
from sandbox.daemon import Sandbox
from sandbox.frozen import T0, frozen_sandbox

H = 3600.0


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    with frozen_sandbox(seed=3) as s:
        yield s


Sleeps = list[float]


def client(name: str, sbx: Sandbox, mp: pytest.MonkeyPatch, sleeps: Sleeps,
           key: str | None = None) -> Vast | RunPod:
    mp.setenv("VAST_URL", sbx.vast.url)
    mp.setenv("VAST_API_KEY", key or sbx.keys.vast)
    mp.setenv("RUNPOD_API_BASE_URL", sbx.runpod.url)
    mp.setenv("RUNPOD_REST_URL", sbx.runpod.url)
    mp.setenv("RUNPOD_API_KEY", key or sbx.keys.runpod)
    return get_provider(name, retry=RetryPolicy(attempts=3), sleep=sleeps.append, timeout=10)


def rent(c: Vast | RunPod, sbx: Sandbox, labels: list[str]) -> dict[str, str]:
    ids = {}
    for lab in labels:  # a fresh offer each time: a rented machine leaves the market
        offer = c.offers()[0]
        ids[c.rent(offer, RentRequest(label=lab, image="img", disk_gb=20)).box_id] = lab
    sbx.world.advance(sbx.world.boot_delay)
    assert sbx.world.settle(30)
    return ids


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def ledger(sbx: Sandbox, provider: str, since: float, until: float) -> dict[str, float]:
    return {c["id"]: c["gpu_usd"] + c["storage_usd"]
            for c in sbx.world.ledger.charges(since, until, sbx.world.now(), provider)}


def test_vast_reads_every_page_and_the_ledgers_amounts(sbx: Sandbox, monkeypatch) -> None:
    monkeypatch.setattr(vast_mod, "CHARGES_PAGE", 2)  # 5 instances: three pages
    v = client("vast", sbx, monkeypatch, [])
    ids = rent(v, sbx, [f"bill-{n}" for n in range(5)])
    sbx.world.advance(2 * H)
    got = v.charges(at(T0), at(sbx.world.now()))
    want = ledger(sbx, "vast", T0, sbx.world.now())
    assert sorted(got) == sorted(ids) == sorted(want)
    assert all(got[i] == pytest.approx(want[i], abs=0.001) and got[i] > 0 for i in ids)
    # a window is a window: the first hour alone is about half of two
    first = v.charges(at(T0), at(T0 + H))
    assert all(first[i] == pytest.approx(ledger(sbx, "vast", T0, T0 + H)[i], abs=0.001)
               for i in ids)


def test_runpod_lags_and_snaps_to_its_buckets(sbx: Sandbox, monkeypatch) -> None:
    rp = client("runpod", sbx, monkeypatch, [])
    assert rp.billing_lag_s == 300.0
    (pod,) = rent(rp, sbx, ["bill-pod"])
    sbx.world.advance(100)
    assert rp.charges(at(T0), at(sbx.world.now())) == {}  # younger than the billing cycle
    sbx.world.advance(2 * H)
    now = sbx.world.now()
    got = rp.charges(at(T0), at(now))
    want = ledger(sbx, "runpod", T0, now - sbx.world.billing_delay)
    assert got == {pod: pytest.approx(want[pod], abs=1e-5)} and got[pod] > 0
    # from half past: hour buckets, RunPod counts that hour from its start
    assert rp.charges(at(T0 + 0.5 * H), at(now)) == {pod: pytest.approx(got[pod], abs=1e-5)}


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_a_5xx_is_retried_and_a_storm_is_a_provider_error(name: str, sbx: Sandbox,
                                                          monkeypatch) -> None:
    sleeps: Sleeps = []
    c = client(name, sbx, monkeypatch, sleeps)
    sbx.world.faults.add("server_error", f"{name}.charges", count=2, status=503)
    assert c.charges(at(T0), at(T0 + H)) == {}  # the third try answers
    assert len(sleeps) == 2
    sbx.world.faults.add("server_error", f"{name}.charges", count=50)
    with pytest.raises(ProviderError, match="after 3 tries") as e:
        c.charges(at(T0), at(T0 + H))
    assert e.value.provider == name
    assert e.value.call in ("GET /api/v0/charges/", "GET /v2/billing/pods")
    sbx.world.faults.clear()


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_a_429_storm_is_rate_limited_and_a_bad_key_is_auth_failed(name: str, sbx: Sandbox,
                                                                  monkeypatch) -> None:
    c = client(name, sbx, monkeypatch, [])
    sbx.world.faults.add("rate_limit", f"{name}.charges", count=50)
    with pytest.raises(RateLimited):
        c.charges(at(T0), at(T0 + H))
    sbx.world.faults.clear()
    bad = client(name, sbx, monkeypatch, [], key="not-the-key")
    with pytest.raises(AuthFailed) as e:
        bad.charges(at(T0), at(T0) + timedelta(hours=1))
    assert "not-the-key" not in str(e.value)
