"""A canary key must never reach an error, a repr, a log line or the test's output.

The fakes here are hostile: every error body, GraphQL message and connection error quotes the
Authorization header back.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

import httpx
import pytest
from provider_fakes import CANARY, FakeRunPod, FakeVast, gql_error, make_http

from fleet.core.errors import ProviderError
from fleet.providers.base import Offer, RentRequest
from fleet.providers.client import Client
from fleet.providers.runpod import RunPod
from fleet.providers.vast import Vast


def echo(status: int) -> Callable[[httpx.Request], httpx.Response]:
    return lambda req: httpx.Response(status, text=f"bad request, {req.headers['Authorization']}")


def echo_gql(req: httpx.Request) -> httpx.Response:
    key = req.headers["Authorization"]
    return gql_error("podFindAndDeployOnDemand",
                     f"There are no longer any instances available ({key})")


def connect_error(req: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError(f"refused while sending {req.headers['Authorization']}")


def read_timeout(req: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout(f"timed out, key {CANARY}")


FAULTS = {
    "5xx": [("before", echo(500))] * 4,
    "4xx": [("before", echo(400))],
    "429": [("before", echo(429))] * 4,
    "401": [("before", echo(401))],
    "connect": [("before", connect_error)] * 4,
    "timeout": [("before", read_timeout)] * 4,
}


def clients() -> list[tuple[Client, FakeRunPod | FakeVast, Offer, str]]:
    rp, v = FakeRunPod(), FakeVast()
    return [
        (RunPod(make_http("runpod", rp)), rp,
         Offer("runpod", "x:SECURE", "RTX 4090", 1, 0.69, cloud="SECURE"),
         "podFindAndDeployOnDemand"),
        (Vast(make_http("vast", v)), v, Offer("vast", "501", "RTX 4090", 1, 0.41), "create"),
    ]


def assert_clean(err: BaseException) -> None:
    text = "".join(traceback.format_exception(err))
    assert CANARY not in text and CANARY not in repr(err)
    if isinstance(err, ProviderError):
        assert CANARY not in err.detail + err.hint


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("which", [0, 1], ids=["runpod", "vast"])
def test_no_key_in_any_error_log_or_output(
    which: int, fault: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    client, fake, offer, create = clients()[which]
    fake.queue(create, *FAULTS[fault])
    with pytest.raises(ProviderError) as e:
        client.rent(offer, RentRequest(label="canary-1", image="i", disk_gb=10))
    assert_clean(e.value)
    assert CANARY not in repr(client) and CANARY not in repr(client.http)
    out = capsys.readouterr()
    assert CANARY not in caplog.text + out.out + out.err
    assert fake.requests and all(
        r.headers["Authorization"] == f"Bearer {CANARY}" for r in fake.requests
    )  # the key was really sent, so its absence above means something


def test_graphql_message_quoting_the_key() -> None:
    client, fake, offer, create = clients()[0]
    fake.queue(create, ("before", echo_gql))
    with pytest.raises(ProviderError) as e:
        client.rent(offer, RentRequest(label="canary-2", image="i", disk_gb=10))
    assert "no longer any instances available" in e.value.detail
    assert_clean(e.value)
