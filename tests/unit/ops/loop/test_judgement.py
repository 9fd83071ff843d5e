"""`fleet.ops.judgement`: the loop's rules on deaths, as plain functions of what a tick saw."""

from __future__ import annotations

from fleet.ops import judgement


def test_one_failure_is_never_many_and_two_of_four_are_not_either() -> None:
    assert not judgement.many(1, 1)  # a lone box: the one case the fleet cannot tell apart
    assert not judgement.many(2, 4)  # the shipped roster with one provider's path down
    assert judgement.many(2, 3) and judgement.many(2, 2)


def test_one_providers_ssh_path_down_opens_its_breaker_and_not_the_fleets() -> None:
    """The shipped roster, 2 Vast + 2 RunPod boxes: the SSH path to Vast's fails. Fleet-wide
    that is 2 of 4 (no blindness), but both of Vast's: its breaker holds their deaths."""
    judged = {"vast": {"v1", "v2"}, "runpod": {"r1", "r2"}}
    down = {"v1", "v2"}
    assert judgement.fleet_blind(down, {"v1", "v2", "r1", "r2"}) is None
    out = judgement.breakers(judged, set(), down, was_open=[], answered={"runpod"})
    assert list(out) == ["vast"] and "2 of 2 fail at once" in out["vast"]
    assert "0 left out of its listing, 2 not answering SSH" in out["vast"]


def test_a_listing_gap_and_ssh_failures_add_up_for_the_breaker() -> None:
    judged = {"vast": {"v1", "v2", "v3"}}
    out = judgement.breakers(judged, unlisted={"v1"}, down={"v2"}, was_open=[], answered=[])
    assert "2 of 3 fail at once: 1 left out of its listing, 1 not answering SSH" in out["vast"]


def test_an_open_breaker_stays_open_until_one_of_its_boxes_answers() -> None:
    judged = {"vast": {"v1", "v2", "v3"}}
    # one of three still fails (one replaced meanwhile, one back): not many, but none answered
    held = judgement.breakers(judged, set(), {"v1"}, was_open=["vast"], answered=[])
    assert held["vast"].startswith("still open")
    assert judgement.breakers(judged, set(), {"v1"}, was_open=["vast"], answered=["vast"]) == {}
    assert judgement.breakers(judged, set(), set(), was_open=["vast"], answered=[]) == {}


def test_most_boxes_failing_at_once_is_the_fleets_blindness() -> None:
    why = judgement.fleet_blind({"a", "b", "c"}, {"a", "b", "c", "d"})
    assert why is not None and why.startswith("3 of 4 boxes did not answer SSH at once")


def test_a_gap_is_many_of_a_providers_boxes_left_out_of_its_listing() -> None:
    assert judgement.gap(["v1", "v2", "v3"], {"v1", "v2"}) == "2 of its 3 boxes"
    assert judgement.gap(["v1", "v2", "v3"], {"v1"}) is None
    assert judgement.gap(["v1"], {"v1"}) is None  # one box left out: believed


def test_the_sweep_refuses_when_the_registry_cannot_be_trusted() -> None:
    assert "no live box" in (judgement.sweep_refusal(0, 1, []) or "")
    assert judgement.sweep_refusal(2, 3, []) == "3 orphans outnumber the registry's 2 live boxes"
    behind = judgement.sweep_refusal(3, 1, ["a", "b", "c", "d"]) or ""
    assert behind.startswith("the registry never recorded a rent of a, b, c and more")
    assert judgement.sweep_refusal(3, 3, []) is None


THEN = {"uptime_s": 3600.0, "machine": "m1"}  # what RunPod listed when it last answered


def test_a_changed_host_key_is_repinned_on_a_restart_its_provider_lists_since_last_seen() -> None:
    """Same id on the same machine, up 30 s where it was up an hour when it last answered:
    RunPod says it restarted since."""
    assert judgement.repin_refusal("runpod", "pod1", "pod1", "m1", 30.0, THEN) is None


def test_every_changed_host_key_the_provider_does_not_vouch_for_is_refused() -> None:
    """Each case the fleet cannot tell is a refusal, never a re-pin on its own guess."""
    refused = {
        "Vast keeps its disk and keys": ("vast", "pod1", "pod1", "m1", 30.0, THEN),
        "another box under the label": ("runpod", "pod1", "pod2", "m1", 30.0, THEN),
        "no id pinned": ("runpod", None, "pod1", "m1", 30.0, THEN),
        "another machine": ("runpod", "pod1", "pod1", "m2", 30.0, THEN),
        "no restart since last answered": ("runpod", "pod1", "pod1", "m1", 3700.0, THEN),
        "the same uptime": ("runpod", "pod1", "pod1", "m1", 3600.0, THEN),
        "no uptime listed (RunPod's 0 reads as none)": ("runpod", "pod1", "pod1", "m1", None,
                                                        THEN),
        "never seen answering": ("runpod", "pod1", "pod1", "m1", 30.0, None),
        "no uptime listed when it answered": ("runpod", "pod1", "pod1", "m1", 30.0,
                                              {"uptime_s": None, "machine": "m1"}),
        "an uptime that is not a number": ("runpod", "pod1", "pod1", "m1", float("nan"), THEN),
        "a recorded uptime that is not a number": ("runpod", "pod1", "pod1", "m1", 30.0,
                                                   {"uptime_s": float("nan"), "machine": None}),
        "a negative uptime": ("runpod", "pod1", "pod1", "m1", -1.0, THEN),
    }
    for case, args in refused.items():
        why = judgement.repin_refusal(*args)  # type: ignore[arg-type]
        assert why, case
    assert "pod2" in str(judgement.repin_refusal("runpod", "pod1", "pod2", "m1", 30.0, THEN))
    assert "no restart since" in str(judgement.repin_refusal("runpod", "pod1", "pod1", "m1",
                                                             3700.0, THEN))
