"""The page at scale: the scrubber's output (known secrets replaced one after another, longest
first, as the page has always done) and the work a page build does as the fleet grows, counted
(never timed): no two rows compared, and scrubbing a text asks nothing of each known secret."""

from __future__ import annotations

import builtins
import random
import sys
from collections import Counter
from datetime import timedelta
from typing import Any

import page_fixture as F
import pytest

from fleet import page
from fleet.core.boxes import Row
from fleet.core.verdicts import Health


def row(label: str, host: str | None = None, port: int | None = None, ip: str | None = None,
        key: str | None = None) -> Row:
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, status="running", ssh_host=host, ssh_port=port,
               public_ip=ip, host_key=key)


SECRET_ROWS = [
    row("a", "203.0.113.7", 47913, "203.0.113.70"),  # host a prefix of the IP and host:port
    row("b", "xab", ip="abcd"),  # overlapping: "xabcd" holds both
    row("c", "h.st(1)+", ip="[a-z]*", key="ssh-ed25519 K3y+/=="),  # regex metacharacters
    row("d", "ed]x", ip="d]x"),  # both match across the "[redacted]" put in before them
]


@pytest.mark.parametrize(("text", "scrubbed"), [
    ("to 203.0.113.70 and 203.0.113.7:47913 and 203.0.113.7:2",
     "to [redacted] and [redacted] and [redacted]:2"),
    ("xabcd", "x[redacted]"),  # the longer secret goes first, the shorter one is then gone
    ("h.st(1)+ hXst(1)+ [a-z]* az", "[redacted] hXst(1)+ [redacted] az"),
    ("key K3y+/== and ssh-ed25519 K3y+/== end", "key [redacted] and [redacted] end"),
    ("xab abcd abcdx", "[redacted] [redacted] [redact[redacted]"),
    ("red]x xabx", "r[redacted] [redacted]x"),
    ("nothing known here", "nothing known here"),
])
def test_the_scrubber_replaces_known_secrets_longest_first_one_after_another(
        text: str, scrubbed: str) -> None:
    assert page.Scrubber(SECRET_ROWS)(text) == scrubbed


def one_after_another(secrets: list[str], text: str) -> str:
    """The known secrets' replacement as the page has always done it: each secret in turn,
    longest first, over the text the ones before it left."""
    for v in sorted(set(secrets), key=lambda s: (-len(s), s)):
        text = text.replace(v, "[redacted]")
    return text


def test_the_scrubber_matches_replacing_one_secret_after_another_on_random_overlaps() -> None:
    # a small alphabet (with the marker's letters and regex metacharacters, and nothing the
    # address and key patterns read) makes secrets overlap, nest and recur in the marker
    rnd = random.Random(5)
    alphabet = "acdert[].*+(\\ "
    for _ in range(300):
        secrets = ["".join(rnd.choices(alphabet, k=rnd.randint(1, 5)))
                   for _ in range(rnd.randint(1, 6))]
        rows = [row(f"r{i}", host=s) for i, s in enumerate(secrets)]
        scrub = page.Scrubber(rows)
        for _ in range(20):
            text = "".join(rnd.choices(alphabet, k=rnd.randint(0, 40)))
            assert scrub(text) == one_after_another(secrets, text), (secrets, text)


def fleet(n: int) -> tuple[list[Row], list[Health]]:
    """n standing boxes, each with its own endpoint, address and host key, all checked well."""
    rows, health = [], []
    for i in range(n):
        label = f"live-vast-{i:05d}"
        rows.append(F.row(label, 0.3, timedelta(hours=1), ssh_host=f"10.1.{i // 256}.{i % 256}",
                          ssh_port=20000 + i, public_ip=f"100.64.{i // 256}.{i % 256}",
                          host_key=f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{i:020d}",
                          place=f"vast machine {i}"))
        health.append(Health(label, "vast", ssh=True, agent=True, synced=True,
                             node_sha16=F.WANTED, wanted_sha16=F.WANTED))
    return rows, health


def test_a_page_build_compares_no_two_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    rows, health = fleet(300)
    compared = Counter[str]()
    eq = Row.__eq__

    def counted(self: Row, other: Any) -> Any:
        compared["rows"] += 1
        return eq(self, other)

    monkeypatch.setattr(Row, "__eq__", counted)
    d = page.build(page.PageInputs(F.config(), rows, health, [], F.NOW))
    assert d["totals"]["verdicts"]["well"] == 300  # every box judged, by its label
    assert compared["rows"] == 0


def calls_to_scrub(scrub: page.Scrubber, texts: list[str]) -> int:
    """The function calls (Python's and C's) made while `scrub` scrubs `texts`."""
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        for t in texts:
            scrub(t)
    finally:
        sys.setprofile(None)
    return calls


def test_scrubbing_a_text_does_as_much_work_with_5000_secrets_known_as_with_5() -> None:
    texts = ["vast machine 17", "ssh to gpu-host-x: connection refused", "node: behind by 3",
             "runpod data center EU-RO-1"]
    few = page.Scrubber(fleet(1)[0])
    many = page.Scrubber(fleet(1000)[0])
    assert len(many.known) == 1000 * len(few.known) == 5000
    assert calls_to_scrub(many, texts) == calls_to_scrub(few, texts)


def failed_lookups_rendering(n: int) -> int:
    """The attribute lookups (`getattr`) that fail while the page of n boxes is rendered."""
    rows, health = fleet(n)
    d = page.build(page.PageInputs(F.config(), rows, health, [], F.NOW))
    page.render(d)  # the template compiled and cached: not counted
    failed = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal failed
        if event == "c_exception" and arg is builtins.getattr:
            failed += 1

    sys.setprofile(count)
    try:
        page.render(d)
    finally:
        sys.setprofile(None)
    return failed


def test_rendering_reads_each_boxs_fields_without_a_failed_lookup_per_field() -> None:
    # the page's data is dicts: a field read as an attribute first fails for every box
    assert failed_lookups_rendering(200) == failed_lookups_rendering(100)
