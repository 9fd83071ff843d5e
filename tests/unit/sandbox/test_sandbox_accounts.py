"""Several accounts per provider: each API key owns the boxes made with it, and sees, stops,
destroys and is billed for those alone, through fleet's own provider clients over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from fleet.core.config import KEY_ENV
from fleet.core.errors import AuthFailed, ProviderError
from fleet.providers.base import Box, RentRequest
from fleet.providers.factory import AnyClient, get_provider
from fleet.providers.http import RetryPolicy
from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox
from sandbox.frozen import frozen_sandbox

PROVIDERS = ("vast", "runpod")


@pytest.fixture
def sbx(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    with frozen_sandbox(seed=11) as s:
        for k, v in s.env().items():
            monkeypatch.setenv(k, v)
        yield s


def client(name: str, key: str, monkeypatch: pytest.MonkeyPatch) -> AnyClient:
    """The fleet's client for `name` as the operator gets it, its key `key`."""
    monkeypatch.setenv(KEY_ENV[name], key)
    return get_provider(name, retry=RetryPolicy(attempts=1), sleep=lambda s: None,
                        destroy_polls=1, poll_interval=0)


def second_key(sbx: Sandbox, name: str) -> str:
    with ControlClient(sbx.control.url) as c:
        return c.add_account(name)


def rent(p: AnyClient, label: str) -> Box:
    return p.rent(p.offers()[0], RentRequest(label=label, image="img", disk_gb=20))


def listed(p: AnyClient) -> list[str]:
    """The labels of the boxes the client's listing shows."""
    return sorted(b.label for b in p.boxes() if isinstance(b, Box))


def booted(sbx: Sandbox) -> None:
    sbx.world.advance(sbx.world.boot_delay)
    assert sbx.world.settle(30)


@pytest.mark.parametrize("name", PROVIDERS)
def test_each_key_lists_and_finds_only_its_own_boxes(
        sbx: Sandbox, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    first_key, other_key = getattr(sbx.keys, name), second_key(sbx, name)
    first, other = client(name, first_key, monkeypatch), client(name, other_key, monkeypatch)
    assert other.boxes() == []  # a new account is empty
    mine, theirs = rent(first, "mine"), rent(other, "theirs")
    booted(sbx)
    assert listed(first) == ["mine"] and listed(other) == ["theirs"]
    assert first.box(theirs.box_id) is None and other.box(mine.box_id) is None
    assert first.find_by_label("theirs") is None
    found = other.box(theirs.box_id)
    assert found is not None and found.status == "running"


@pytest.mark.parametrize("name", PROVIDERS)
def test_another_accounts_box_is_neither_stopped_nor_destroyed(
        sbx: Sandbox, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    first = client(name, getattr(sbx.keys, name), monkeypatch)
    mine = rent(first, "mine")
    booted(sbx)
    other = client(name, second_key(sbx, name), monkeypatch)
    with pytest.raises(ProviderError, match="not found"):
        other.stop(mine.box_id)
    with pytest.raises(ProviderError, match="another account; not read as destroyed"):
        other.destroy(mine.box_id)  # "no such box" for a box its key never saw: not gone
    kept = first.box(mine.box_id)
    assert kept is not None and kept.status == "running"
    first.destroy(mine.box_id)
    assert first.box(mine.box_id) is None


@pytest.mark.parametrize("name", PROVIDERS)
def test_an_unknown_key_is_still_refused(sbx: Sandbox, monkeypatch: pytest.MonkeyPatch,
                                         name: str) -> None:
    second_key(sbx, name)
    stranger = client(name, "rpa_NOTAKEY" if name == "runpod" else "0" * 64, monkeypatch)
    with pytest.raises(AuthFailed):
        stranger.boxes()


@pytest.mark.parametrize("name", PROVIDERS)
def test_each_account_is_billed_for_its_own_boxes(
        sbx: Sandbox, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    sbx.world.billing_delay = 0  # RunPod's bill would lag five minutes
    first = client(name, getattr(sbx.keys, name), monkeypatch)
    other = client(name, second_key(sbx, name), monkeypatch)
    mine, theirs = rent(first, "mine"), rent(other, "theirs")
    booted(sbx)
    since = datetime.fromtimestamp(sbx.world.now(), UTC).replace(minute=0, second=0)
    sbx.world.advance(3600)
    until = datetime.fromtimestamp(sbx.world.now(), UTC)
    assert set(first.charges(since, until)) == {mine.box_id}
    assert set(other.charges(since, until)) == {theirs.box_id}


def test_with_one_key_per_provider_every_box_is_the_first_accounts(
        sbx: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    with ControlClient(sbx.control.url) as c:
        made = c.create_instances("vast", 2, label_prefix="bulk")
        assert {i["account"] for i in made} == {1}
        assert c.health()["accounts"] == {"runpod": 1, "vast": 1}
    booted(sbx)
    vast = client("vast", sbx.keys.vast, monkeypatch)
    assert listed(vast) == ["bulk-0000", "bulk-0001"]
