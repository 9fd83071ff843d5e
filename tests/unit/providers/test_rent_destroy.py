"""The money rules, on both providers: one box per label, destroy means gone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from provider_fakes import FakeRunPod, FakeVast, gql_error, make_http

from fleet.core.errors import NoCapacity, OfferGone, ProviderError, RentOutcomeUnknown, UsageError
from fleet.providers.base import Offer, RentRequest
from fleet.providers.client import Client, check_label
from fleet.providers.runpod import RunPod
from fleet.providers.vast import Vast


@dataclass
class Case:
    client: Client
    fake: Any
    offer: Offer
    create: str  # the fake's call names
    list: str
    show: str
    destroy: str

    def count(self, label: str) -> int:
        rows = self.fake.pods.values() if isinstance(self.fake, FakeRunPod) else \
            self.fake.instances.values()
        return sum(1 for r in rows if (r.get("name") or r.get("label")) == label)

    def add(self, label: str) -> str:
        return str(self.fake.add(label))

    def creates(self) -> int:
        return sum(1 for r in self.fake.requests if self.create.encode() in r.content
                   or (r.method == "PUT" and "/asks/" in r.url.path))


@pytest.fixture(params=["runpod", "vast"])
def case(request: pytest.FixtureRequest) -> Case:
    if request.param == "runpod":
        rp = FakeRunPod()
        return Case(RunPod(make_http("runpod", rp), destroy_polls=4, poll_interval=1.0), rp,
                    Offer("runpod", "x:SECURE", "RTX 4090", 1, 0.69, cloud="SECURE"),
                    "podFindAndDeployOnDemand", "myself", "pod", "podTerminate")
    v = FakeVast()
    return Case(Vast(make_http("vast", v), destroy_polls=4, poll_interval=1.0), v,
                Offer("vast", "501", "RTX 4090", 1, 0.41), "create", "list", "show", "destroy")


REQ = RentRequest(label="live-x-000001", image="img", disk_gb=20)


@pytest.mark.parametrize("lost", [httpx.ReadTimeout("timed out"),
                                  httpx.RemoteProtocolError("Server disconnected")])
def test_create_that_lands_but_never_answers_yields_one_box(case: Case, lost: Exception) -> None:
    case.fake.queue(case.create, ("after", lost))
    box = case.client.rent(case.offer, REQ)
    assert box.label == REQ.label and case.count(REQ.label) == 1
    assert case.creates() == 1  # found by its label, not created again


def test_create_that_failed_unseen_is_tried_again(case: Case) -> None:
    case.fake.queue(case.create, ("before", httpx.ReadTimeout("timed out")),
                    ("before", httpx.Response(502, text="bad gateway")))
    box = case.client.rent(case.offer, REQ)
    assert box.label == REQ.label and case.count(REQ.label) == 1
    assert case.creates() == 3


def test_create_that_never_lands_gives_up_clearly(case: Case) -> None:
    case.fake.queue(case.create, *[("before", httpx.ReadTimeout("timed out"))] * 4)
    with pytest.raises(ProviderError) as e:
        case.client.rent(case.offer, REQ)
    assert REQ.label in e.value.hint and "no box labelled" in e.value.detail
    assert case.count(REQ.label) == 0 and case.creates() == 4


def test_a_late_landing_duplicate_is_destroyed(case: Case) -> None:
    def duplicate_appears(req: httpx.Request) -> httpx.Response:
        case.add(REQ.label)  # the timed-out create lands after it was looked for
        return case.fake.answer(req)

    case.fake.queue(case.create, ("before", httpx.ReadTimeout("timed out")))
    # list calls: the check before renting, the lookup after the timeout, then the dedupe
    case.fake.queue(case.list, ("before", None), ("before", None), ("before", duplicate_appears))
    box = case.client.rent(case.offer, REQ)
    assert case.count(REQ.label) == 1
    assert case.client.box(box.box_id) is not None  # the one kept is the one returned


def test_renting_a_label_twice_returns_the_first_box(case: Case) -> None:
    first = case.client.rent(case.offer, REQ)
    again = case.client.rent(case.offer, REQ)
    assert again.box_id == first.box_id and case.count(REQ.label) == 1


def test_destroy_waits_until_the_box_is_no_longer_listed(case: Case) -> None:
    box_id = case.add("d1")
    still_there = case.client.box(box_id)
    assert still_there is not None
    case.fake.requests.clear()
    shown = httpx.Response(200, json=({"instances": still_there.raw}
                                      if isinstance(case.fake, FakeVast)
                                      else {"data": {"pod": still_there.raw}}))
    case.fake.queue(case.show, ("before", shown), ("before", shown))
    case.client.destroy(box_id)
    assert case.client.box(box_id) is None
    assert case.fake.sleeps == [1.0, 1.0]


def test_destroy_that_never_takes_is_an_error(case: Case) -> None:
    box_id = case.add("d2")
    case.fake.terminate_removes = case.fake.destroy_removes = False
    with pytest.raises(ProviderError) as e:
        case.client.destroy(box_id)
    assert e.value.call == "destroy" and "still listed" in e.value.detail
    assert "bill" in e.value.hint


def test_destroying_a_box_already_gone_is_fine(case: Case) -> None:
    box_id = case.add("d3")
    case.client.destroy(box_id)
    case.client.destroy(box_id)
    assert case.client.box(box_id) is None


def test_offer_of_another_provider_is_refused(case: Case) -> None:
    other = Offer("aws", "1", "RTX 4090", 1, 1.0)
    with pytest.raises(UsageError):
        case.client.rent(other, REQ)


@pytest.mark.parametrize("label", ["", "has space", "x" * 61, "-lead", "a/b"])
def test_bad_labels(label: str) -> None:
    with pytest.raises(UsageError):
        check_label(label)


def test_dedupe_keeps_the_new_box_even_when_the_listing_lags(case: Case) -> None:
    a, b = case.add("dup"), case.add("dup")
    listed = case.client._by_label("dup")
    assert case.client._keep_one(listed, keep="not-listed-yet") is None
    assert case.client.box(a) is None and case.client.box(b) is None


def test_dedupe_without_a_preference_keeps_the_oldest(case: Case) -> None:
    a, b = case.add("dup2"), case.add("dup2")
    kept = case.client._keep_one(case.client._by_label("dup2"))
    assert kept is not None and kept.box_id == a
    assert case.client.box(b) is None


# --- a refusal after an unknown outcome: the first create may have taken the machine -------

def _refusal(case: Case) -> httpx.Response:
    if isinstance(case.fake, FakeVast):
        return httpx.Response(404, json={"success": False, "error": "no_such_ask",
                                         "msg": "ask 501 is no longer available"})
    return gql_error(case.create, "There are no longer any instances available with the "
                                  "requested specifications.")


def _empty(case: Case) -> httpx.Response:
    if isinstance(case.fake, FakeVast):
        return httpx.Response(200, json={"success": True, "instances": [], "next_token": None})
    return httpx.Response(200, json={"data": {"myself": {"pods": []}}})


def test_a_refusal_after_a_create_that_landed_unseen_returns_that_box(case: Case) -> None:
    # the first create lands but its answer is lost, the lookup after it does not see it
    # yet, and the retry is refused because the first took the machine
    case.fake.queue(case.create, ("after", httpx.ReadTimeout("timed out")),
                    ("before", _refusal(case)))
    case.fake.queue(case.list, ("before", None), ("before", _empty(case)))
    box = case.client.rent(case.offer, REQ)
    assert box.label == REQ.label and case.count(REQ.label) == 1 and case.creates() == 2


def test_a_refusal_after_an_unknown_create_is_not_reported_as_gone(case: Case) -> None:
    case.fake.queue(case.create, ("after", httpx.ReadTimeout("timed out")),
                    ("before", _refusal(case)))
    case.fake.queue(case.list, ("before", None), *[("before", _empty(case))] * 2)
    with pytest.raises(RentOutcomeUnknown) as e:
        case.client.rent(case.offer, REQ)
    assert not isinstance(e.value, NoCapacity | OfferGone)
    assert REQ.label in str(e.value) and case.count(REQ.label) == 1  # it does exist


def test_a_lookup_that_fails_after_an_unknown_create_is_an_unknown_outcome(case: Case) -> None:
    case.fake.queue(case.create, ("after", httpx.ReadTimeout("timed out")))
    case.fake.queue(case.list, ("before", None),
                    *[("before", httpx.Response(503, text="unavailable"))] * 4)
    with pytest.raises(RentOutcomeUnknown):
        case.client.rent(case.offer, REQ)
    assert case.creates() == 1


# --- "no such box" is gone only for a box this key's account is known to have held ----------

def _never_seen_id(case: Case) -> str:
    # an id no listing or lookup of this key's account ever showed: another account's box
    return "4242" if isinstance(case.fake, FakeVast) else "podelsewhere"


def test_destroying_a_box_this_key_never_saw_is_an_error_not_gone(case: Case) -> None:
    box_id = _never_seen_id(case)
    with pytest.raises(ProviderError) as e:
        case.client.destroy(box_id)
    text = str(e.value)
    assert "\n" not in text and box_id in text
    assert "no such box on this key's account" in text and "another account" in text
    assert "not read as destroyed" in text


def test_a_box_this_key_listed_and_that_then_went_is_read_as_gone(case: Case) -> None:
    box_id = case.add("went")
    assert box_id in {b.box_id for b in case.client.boxes()}  # seen on this key's account
    # it goes before the fleet's destroy (someone else destroyed it, or its host took it)
    (case.fake.pods if isinstance(case.fake, FakeRunPod) else case.fake.instances).pop(
        box_id if isinstance(case.fake, FakeRunPod) else int(box_id))
    case.client.destroy(box_id)
    assert case.client.box(box_id) is None
