"""Both provider clients against the sandbox's fake APIs, through every fault it can inject.

One sandbox daemon per module (a tmp state dir, always taken down), its API keys replaced by
canary keys before it starts: no test's error, log or output may show them. Retries sleep
through a recorder, so backoff costs nothing; boots and host deaths are driven through the
control surface's clock.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from fleet.core.errors import AuthFailed, NoCapacity, OfferGone, RateLimited
from fleet.providers.base import Box, RentRequest
from fleet.providers.factory import get_provider
from fleet.providers.http import RetryPolicy
from sandbox import manage
from sandbox.control_client import ControlClient

CANARY = {"runpod": "rpa_CANARY0RUNPOD0KEY0X9Q7", "vast": "canary0vast0key0e3b1f77"}
PROVIDERS = ("runpod", "vast")
BOOT = 0.5  # the world's boot delay; the clock is advanced past it


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    state = tmp_path_factory.mktemp("sandbox")
    (state / "keys.json").write_text(json.dumps(CANARY))
    try:
        manage.up(state, seed=7, boot_delay=BOOT, machines_per_provider=48)
        env = manage.load_env(state)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            yield env
    finally:
        manage.down(state)


@pytest.fixture
def control(sandbox: dict[str, str]) -> Iterator[ControlClient]:
    with ControlClient(sandbox["FLEET_SANDBOX_CONTROL"]) as c:
        c.clear_faults()
        yield c
        c.clear_faults()


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def client(name: str, sleeps: Sleeps | None = None, **kw: Any) -> Any:
    return get_provider(name, retry=RetryPolicy(attempts=4, base_delay=0.5),
                        sleep=sleeps if sleeps is not None else Sleeps(), **kw)


@pytest.fixture(autouse=True)
def no_key_anywhere(caplog: pytest.LogCaptureFixture,
                    capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    out = capsys.readouterr()
    for key in CANARY.values():
        assert key not in caplog.text + out.out + out.err


def clean(err: BaseException) -> BaseException:
    for key in CANARY.values():
        assert key not in str(err) and key not in repr(err)
    return err


_n = 0


def req(provider: str, **kw: Any) -> RentRequest:
    global _n
    _n += 1
    return RentRequest(label=f"it-{provider}-{_n:04d}", image="sandbox:latest", disk_gb=20,
                       tcp_ports=(22, 26611), env={"PUBLIC_KEY": "ssh-ed25519 AAAA test"}, **kw)


def cheapest(p: Any, **kw: Any) -> Any:
    offers = p.offers(gpu_count=1, direct_ports=1, **kw)
    assert offers, f"{p.name}: no offers"
    return offers[0]


def labelled(p: Any, label: str) -> list[Box]:
    return [b for b in p.boxes() if b.label == label]


def boot(control: ControlClient) -> None:
    control.advance(BOOT + 0.1)
    assert control.settle(10.0)


# -- the happy path ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROVIDERS)
def test_rent_boot_list_stop_destroy(control: ControlClient, name: str) -> None:
    p = client(name)
    offer = cheapest(p)
    r = req(name)
    box = p.rent(offer, r)
    assert (box.provider, box.label, box.status, box.card) == (name, r.label, "provisioning",
                                                               offer.card)
    boot(control)
    up = p.box(box.box_id)
    assert up is not None and up.status == "running" and up.ssh_ready
    assert up.public_ip and up.ssh_host == up.public_ip and up.p2p_public_port
    assert up.ports[26611] == up.p2p_public_port and up.ports[22] == up.ssh_port
    assert up.gpu_count == 1 and up.usd_per_hour > 0 and up.card == offer.card
    seen = next(i for i in control.instances() if i["id"] == box.box_id)
    assert (seen["ssh_host"], seen["ssh_port"]) == (up.ssh_host, up.ssh_port)
    assert p.find_by_label(r.label) == up
    p.stop(box.box_id)
    assert p.box(box.box_id).status == "stopped"  # type: ignore[union-attr]
    p.destroy(box.box_id)
    assert p.box(box.box_id) is None and labelled(p, r.label) == []


def test_vast_exact_driver_filter(sandbox: dict[str, str]) -> None:
    p = client("vast")
    drivers = {o.driver for o in p.offers()}
    assert len(drivers) > 1  # the world has several, so the filter has work to do
    for d in drivers:
        got = p.offers(driver=d)
        assert got and {o.driver for o in got} == {d}


def test_vast_direct_port_count_filter(sandbox: dict[str, str]) -> None:
    p = client("vast")
    assert all((o.direct_ports or 0) >= 100 for o in p.offers(direct_ports=100))
    assert any((o.direct_ports or 0) < 100 for o in p.offers())


def test_runpod_cuda_filter(sandbox: dict[str, str]) -> None:
    p = client("runpod")
    assert p.offers(cuda=("13.0",))
    assert p.offers(cuda=("11.0",)) == []


def test_vast_listing_pages_through_25_at_a_time(control: ControlClient) -> None:
    before = len(client("vast").boxes())
    made = control.create_instances("vast", 30, label_prefix="page")
    try:
        boxes = client("vast").boxes()
        assert len(boxes) == before + 30
        assert {b.label for b in boxes} >= {m["label"] for m in made}
    finally:
        p = client("vast")
        for m in made:
            p.destroy(m["id"])


# -- faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name, where, err", [
    ("runpod", "runpod.create", NoCapacity),
    ("vast", "vast.create", OfferGone),  # Vast says so with 410 no_such_ask
])
def test_no_capacity(control: ControlClient, name: str, where: str, err: type) -> None:
    p = client(name)
    offer = cheapest(p)
    r = req(name)
    control.fault("no_capacity", where)
    with pytest.raises(err) as e:
        p.rent(offer, r)
    clean(e.value)
    assert e.value.provider == name and labelled(p, r.label) == []


@pytest.mark.parametrize("name", PROVIDERS)
def test_no_capacity_in_search(control: ControlClient, name: str) -> None:
    control.fault("no_capacity", f"{name}.search", count=2)
    assert client(name).offers() == []


@pytest.mark.parametrize("name, err", [("runpod", NoCapacity), ("vast", OfferGone)])
def test_offer_gone(control: ControlClient, name: str, err: type) -> None:
    p = client(name)
    offer = cheapest(p)
    control.fault("offer_gone", f"{name}.create")
    with pytest.raises(err) as e:
        p.rent(offer, req(name))
    clean(e.value)


def test_runpod_429_honours_retry_after(control: ControlClient) -> None:
    sleeps = Sleeps()
    p = client("runpod", sleeps)
    control.fault("rate_limit", "runpod.list", count=2, retry_after=3)
    assert isinstance(p.boxes(), list)
    assert sleeps == [3.0, 3.0]


@pytest.mark.parametrize("body", ["text", "json"])
def test_vast_429_without_retry_after_backs_off(control: ControlClient, body: str) -> None:
    sleeps = Sleeps()
    p = client("vast", sleeps)
    control.fault("rate_limit", "vast.list", count=2, body=body)
    assert isinstance(p.boxes(), list)
    assert len(sleeps) == 2 and 0.25 <= sleeps[0] <= 0.5 and 0.5 <= sleeps[1] <= 1.0


@pytest.mark.parametrize("name", PROVIDERS)
def test_429_that_outlasts_the_retries(control: ControlClient, name: str) -> None:
    p = client(name)
    control.fault("rate_limit", f"{name}.list", count=4)
    with pytest.raises(RateLimited) as e:
        p.boxes()
    clean(e.value)
    assert e.value.provider == name


def test_vast_search_quota_is_not_retried(control: ControlClient) -> None:
    sleeps = Sleeps()
    control.fault("rate_limit", "vast.search", body="quota")
    with pytest.raises(RateLimited):
        client("vast", sleeps).offers()
    assert sleeps == []


@pytest.mark.parametrize("name", PROVIDERS)
def test_5xx_retried(control: ControlClient, name: str) -> None:
    sleeps = Sleeps()
    control.fault("server_error", f"{name}.list", count=2, status=503)
    assert isinstance(client(name, sleeps).boxes(), list)
    assert len(sleeps) == 2


@pytest.mark.parametrize("name", PROVIDERS)
def test_5xx_on_create_yields_one_box(control: ControlClient, name: str) -> None:
    p = client(name)
    offer = cheapest(p)
    r = req(name)
    control.fault("server_error", f"{name}.create", status=502)
    box = p.rent(offer, r)
    assert [b.box_id for b in labelled(p, r.label)] == [box.box_id]
    p.destroy(box.box_id)


@pytest.mark.parametrize("name", PROVIDERS)
@pytest.mark.parametrize("delay", [0.0, 1.5], ids=["dropped", "late"])
def test_create_that_times_out_yet_creates_yields_one_box(
    control: ControlClient, name: str, delay: float
) -> None:
    p = client(name, timeout=0.5)
    offer = cheapest(p)
    r = req(name)
    control.fault("create_timeout", f"{name}.create", delay=delay)
    box = p.rent(offer, r)
    assert box.label == r.label
    assert [b.box_id for b in labelled(p, r.label)] == [box.box_id]
    mine = [i for i in control.instances() if i["label"] == r.label]
    assert len(mine) == 1 and mine[0]["phase"] != "destroyed"
    p.destroy(box.box_id)


@pytest.mark.parametrize("how", ["fault", "bid"])
def test_vast_low_bid_leftover_is_destroyed(control: ControlClient, how: str) -> None:
    p = client("vast")
    offer = cheapest(p)
    r = req("vast", spot_bid=0.001 if how == "bid" else offer.usd_per_hour)
    if how == "fault":
        control.fault("low_bid", "vast.create")
    with pytest.raises(NoCapacity) as e:
        p.rent(offer, r)
    clean(e.value)
    assert "destroyed" in e.value.detail
    assert labelled(p, r.label) == []
    left = [i for i in control.instances() if i["label"] == r.label]
    assert len(left) == 1 and left[0]["phase"] == "destroyed"


@pytest.mark.parametrize("name", PROVIDERS)
def test_auth_failed(sandbox: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                     name: str) -> None:
    bad = f"wrong-{name}-key-000"
    monkeypatch.setenv(f"{name.upper()}_API_KEY", bad)
    with pytest.raises(AuthFailed) as e:
        client(name).boxes()
    clean(e.value)
    assert bad not in str(e.value) and f"{name.upper()}_API_KEY" in str(e.value)


@pytest.mark.parametrize("name", PROVIDERS)
def test_host_death_is_seen_as_a_status(control: ControlClient, name: str) -> None:
    p = client(name)
    box = p.rent(cheapest(p), req(name))
    boot(control)
    assert p.box(box.box_id).status == "running"  # type: ignore[union-attr]
    control.fault("host_death", box.box_id)
    control.advance(6.0)  # past the provider's notice delay
    dead = p.box(box.box_id)
    assert dead is not None and dead.status == "unknown" and not dead.ssh_ready
    control.advance(6.0)  # Vast: unknown, then offline; still "unknown" to the fleet
    assert p.box(box.box_id).status == "unknown"  # type: ignore[union-attr]
    p.destroy(box.box_id)
    assert p.box(box.box_id) is None


@pytest.mark.parametrize("name, status", [("runpod", "exited"), ("vast", "stopped")])
def test_spot_preempt_is_seen_as_a_status(control: ControlClient, name: str,
                                          status: str) -> None:
    p = client(name)
    offer = cheapest(p)
    box = p.rent(offer, req(name, spot_bid=round(offer.usd_per_hour * 2, 3)))
    boot(control)
    control.fault("preempt", box.box_id)
    assert p.box(box.box_id).status == status  # type: ignore[union-attr]
    p.destroy(box.box_id)


@pytest.mark.parametrize("name", PROVIDERS)
def test_destroying_twice_is_fine(control: ControlClient, name: str) -> None:
    p = client(name)
    box = p.rent(cheapest(p), req(name))
    p.destroy(box.box_id)
    p.destroy(box.box_id)
    assert p.box(box.box_id) is None


def test_canary_keys_were_the_ones_used(sandbox: dict[str, str]) -> None:
    assert {os.environ["RUNPOD_API_KEY"], os.environ["VAST_API_KEY"]} == set(CANARY.values())
    assert all(isinstance(b, Box) for n in PROVIDERS for b in client(n).boxes())


@pytest.mark.parametrize("name", PROVIDERS)
def test_the_uptime_listed_starts_over_at_a_container_restart(control: ControlClient,
                                                             name: str) -> None:
    """The provider's word a changed host key is re-pinned on: how long the container has run
    since it last (re)started."""
    p = client(name)
    box = p.rent(cheapest(p), req(name))
    boot(control)
    control.advance(600.0)
    up = p.box(box.box_id)
    assert up is not None and up.uptime_s is not None and up.uptime_s >= 600
    control.fault("container_restart", box.box_id)
    assert control.settle(10.0)
    control.advance(60.0)
    again = p.box(box.box_id)
    assert again is not None and again.uptime_s is not None and 60 <= again.uptime_s < 600
    p.destroy(box.box_id)
