"""Vast's instance listing pages by keyset: the cursor is a position in an id-ordered index.

The fake answers `GET /api/v1/instances/` as Vast does: `next_token` marks the last row a page
returned, and the next page starts after that row, wherever the rows around it went. Rows
created or destroyed between pages neither shift nor repeat the others. In id order (what the
SDK and fleet ask for) a page costs its own rows, not a render and sort of the whole account.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import sandbox.vast_api as vast_api
from sandbox.frozen import FrozenClock
from sandbox.httpbase import Request
from sandbox.vast_api import VastApp
from sandbox.world import Instance, World

KEY = "test-key"
ASC = [{"col": "id", "dir": "asc"}]
DESC = [{"col": "id", "dir": "desc"}]


@pytest.fixture
def world() -> Iterator[World]:
    w = World(seed=11, machines_per_provider=1100, boot_delay=1.0, clock=FrozenClock())
    yield w
    w.close()


@pytest.fixture
def app(world: World) -> VastApp:
    return VastApp(world, KEY)


def get(app: VastApp, **params: Any) -> dict[str, Any]:
    """One listing page; params are JSON-encoded as the SDK sends them (strings as they are)."""
    query = {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
    resp = app(Request("GET", "/api/v1/instances/", query, {"authorization": f"Bearer {KEY}"},
                       b""))
    assert resp.status == 200, resp.body
    body: dict[str, Any] = json.loads(resp.body)
    return body


def pages(app: VastApp, between: Callable[[int], None] = lambda n: None,
          **params: Any) -> list[list[int]]:
    """The ids of every page, following next_token; `between(n)` runs after page n."""
    out: list[list[int]] = []
    while True:
        body = get(app, **params)
        out.append([r["id"] for r in body["instances"]])
        if not body["next_token"]:
            return out
        between(len(out))
        params["after_token"] = body["next_token"]


def ids_of(insts: list[Instance]) -> list[int]:
    return [int(i.id) for i in insts]


def flat(listed: list[list[int]]) -> list[int]:
    return [i for page in listed for i in page]


def test_a_destroy_between_pages_skips_nothing_and_repeats_nothing(world: World,
                                                                  app: VastApp) -> None:
    insts = world.create_many("vast", 30)
    ids = ids_of(insts)

    def destroy(n: int) -> None:
        if n == 1:  # one already listed, one not yet: no live instance may be lost
            world.destroy(insts[3])
            world.destroy(insts[12])

    listed = pages(app, destroy, limit=10, order_by=ASC)
    assert listed[0] == ids[:10]
    assert listed[1] == ids[10:12] + ids[13:21]  # an offset of 10 would have skipped ids[10]
    assert flat(listed) == [i for i in ids if i != ids[12]]


def test_a_destroy_between_pages_in_descending_id_order(world: World, app: VastApp) -> None:
    insts = world.create_many("vast", 30)
    ids = ids_of(insts)[::-1]
    by_id = {int(i.id): i for i in insts}

    def destroy(n: int) -> None:
        if n == 1:
            world.destroy(by_id[ids[0]])
            world.destroy(by_id[ids[15]])

    listed = pages(app, destroy, limit=10, order_by=DESC)
    assert flat(listed) == [i for i in ids if i != ids[15]]


def test_the_cursor_outlives_the_row_it_points_at(world: World, app: VastApp) -> None:
    """The token is a position, not a row: its own row destroyed, the next page still starts
    right after where that row was."""
    insts = world.create_many("vast", 20)
    ids = ids_of(insts)
    first = get(app, limit=5, order_by=ASC)
    assert [r["id"] for r in first["instances"]] == ids[:5]
    world.destroy(insts[4])  # the cursor's row
    world.destroy(insts[0])
    second = get(app, limit=5, order_by=ASC, after_token=first["next_token"])
    assert [r["id"] for r in second["instances"]] == ids[5:10]
    assert second["total_instances"] == 18


def test_instances_created_between_pages_come_once_at_the_end(world: World,
                                                              app: VastApp) -> None:
    insts = world.create_many("vast", 12)
    made: list[Instance] = []

    def create(n: int) -> None:
        made.extend(world.create_many("vast", 2, label_prefix=f"late{n}"))

    listed = pages(app, create, limit=5, order_by=ASC)
    assert flat(listed) == ids_of(insts) + ids_of(made)


def test_other_orders_page_by_keyset_too(world: World, app: VastApp) -> None:
    """A non-default order (a full pass a page) keeps the same promise: the cursor is the
    last row's (label, id), so a destroy between pages moves nothing."""
    insts = world.create_many("vast", 24)
    for n, inst in enumerate(insts):
        inst.label = f"group-{n % 4}"
    order = [{"col": "label", "dir": "asc"}]
    expected = [int(i.id) for i in sorted(insts, key=lambda i: (i.label, int(i.id)))]
    by_id = {int(i.id): i for i in insts}

    def destroy(n: int) -> None:
        if n == 1:
            world.destroy(by_id[expected[2]])
            world.destroy(by_id[expected[9]])

    listed = pages(app, destroy, limit=7, order_by=order)
    assert listed[1] == expected[7:9] + expected[10:15]
    assert flat(listed) == [i for i in expected if i != expected[9]]


def test_a_page_renders_its_own_rows_only_and_sorts_nothing(
        world: World, app: VastApp, monkeypatch: pytest.MonkeyPatch) -> None:
    """The id-ordered listing's cost, counted rather than timed: the rows it renders, the
    index entries it steps on, and no full-world pass or sort."""
    insts = world.create_many("vast", 1000)
    for inst in insts[100:400]:  # destroyed ones before the cursor cost nothing either
        world.destroy(inst)
    rendered: list[str] = []
    real_row = vast_api.instance_row

    def counting_row(w: World, inst: Instance) -> dict[str, Any]:
        rendered.append(inst.id)
        return real_row(w, inst)

    def no_sort(*_: Any) -> Any:
        raise AssertionError("the id-ordered listing sorted every row")

    def no_full_pass(*_: Any) -> Any:
        raise AssertionError("the id-ordered listing read every instance of the world")

    # a cursor at the 900th instance, taken (before counting) from a one-row filtered page
    token = get(app, limit=1, order_by=ASC,
                select_filters={"id": {"gte": int(insts[899].id)}})["next_token"]
    monkeypatch.setattr(vast_api, "instance_row", counting_row)
    monkeypatch.setattr(vast_api, "order_rows", no_sort)
    monkeypatch.setattr(world, "live", no_full_pass)
    stepped = 0
    for order in (ASC, DESC):
        for after in (None, token):
            rendered.clear()
            params: dict[str, Any] = {"limit": 25, "order_by": order}
            if after:
                params["after_token"] = after
            body = get(app, **params)
            assert len(body["instances"]) == 25 and body["total_instances"] == 700
            assert len(rendered) == 25  # the old listing rendered all 700 for every page
            # the page and one more, to know there is more: no scan up to the cursor
            assert app.index.stepped - stepped == 26
            stepped = app.index.stepped
    assert len(app.index.ids) == 700  # the destroyed left the index


def test_the_index_path_answers_exactly_as_the_full_path(world: World, app: VastApp) -> None:
    """Random creates, destroys and relabels between pages: the id-ordered index path and
    the full render-filter-sort path (forced by a filter every row passes) give the same
    pages, tokens, totals and label counts, label order included."""
    rng = random.Random(5)
    live = world.create_many("vast", 40, label_prefix="r")

    def churn(_: int) -> None:
        for _ in range(3):
            pick = rng.random()
            if pick < 0.4 and live:
                world.destroy(live.pop(rng.randrange(len(live))))
            elif pick < 0.7 and live:
                live[rng.randrange(len(live))].label = rng.choice(["", "a", "b", "c"])
            else:
                live.extend(world.create_many("vast", 1, label_prefix=f"n{rng.random()}"))

    everything = {"id": {"gte": 0}}
    for order in (ASC, DESC, None):
        for limit in (1, 7, 25):
            params: dict[str, Any] = {"limit": limit}
            if order is not None:
                params["order_by"] = order
            while True:
                fast = get(app, **params)
                full = get(app, **params, select_filters=everything)
                assert fast == full
                assert list(fast["label_counts"]) == list(full["label_counts"])
                if not fast["next_token"]:
                    break
                churn(0)
                params["after_token"] = fast["next_token"]


def test_select_cols_and_a_cursor_column_left_out(world: World, app: VastApp) -> None:
    """The cursor is taken from the whole row, so select_cols cannot break paging."""
    world.create_many("vast", 6)
    listed = pages(app, limit=4, order_by=[{"col": "label", "dir": "desc"}],
                   select_cols=["actual_status"])
    assert len(flat(listed)) == 6 and len(set(flat(listed))) == 6


@pytest.mark.parametrize("token", [
    "not-a-token",
    base64.urlsafe_b64encode(b'{"o": 25}').decode(),  # the old offset form
    base64.urlsafe_b64encode(b'{"k": ["x"]}').decode(),  # an id that is no id
    base64.urlsafe_b64encode(b'{"k": [1, 2]}').decode(),  # another order's cursor
])
def test_a_token_that_is_no_position_is_refused(world: World, app: VastApp,
                                                 token: str) -> None:
    world.create_many("vast", 3)
    query = {"after_token": token}
    resp = app(Request("GET", "/api/v1/instances/", query,
                       {"authorization": f"Bearer {KEY}"}, b""))
    assert resp.status == 400 and json.loads(resp.body)["msg"] == "invalid after_token"


def test_a_cursor_of_another_type_is_refused_on_the_full_path(world: World,
                                                              app: VastApp) -> None:
    world.create_many("vast", 3)
    token = base64.urlsafe_b64encode(b'{"k": [5, 1]}').decode()  # label order wants a text
    query = {"after_token": token, "order_by": json.dumps([{"col": "label", "dir": "asc"}])}
    resp = app(Request("GET", "/api/v1/instances/", query,
                       {"authorization": f"Bearer {KEY}"}, b""))
    assert resp.status == 400 and json.loads(resp.body)["msg"] == "invalid after_token"


def test_the_index_follows_the_world(world: World, app: VastApp) -> None:
    """Creates through the API and in bulk, RunPod pods among them, destroys: the index,
    after a listing, holds exactly the world's live Vast instances in id order."""
    rng = random.Random(3)
    made = world.create_many("vast", 50)
    world.create_many("runpod", 10)
    get(app)
    for inst in rng.sample(made, 20):
        world.destroy(inst)
    offer = vast_api.search(world, {"num_gpus": {"eq": 1}})[0]
    resp = app(Request("PUT", f"/api/v0/asks/{offer['id']}/", {},
                       {"authorization": f"Bearer {KEY}"},
                       json.dumps({"image": "img", "disk": 20}).encode()))
    assert resp.status == 200, resp.body
    world.create_many("vast", 5, label_prefix="more")
    body = get(app)
    want = sorted(int(i.id) for i in world.live("vast"))
    assert app.index.ids == want and ids_of(app.index.insts) == want
    assert body["total_instances"] == len(want)


def test_label_counts_follow_every_change(world: World, app: VastApp) -> None:
    """The counts are kept encoded between pages; any relabel (even a plain attribute write,
    even a swap that keeps the same counts in another order), create or destroy shows."""
    insts = world.create_many("vast", 4, label_prefix="x")
    everything = {"id": {"gte": 0}}

    def counts() -> list[tuple[str, int]]:
        fast = get(app, limit=2)
        assert fast == get(app, limit=2, select_filters=everything)
        return list(fast["label_counts"].items())

    assert counts() == [("x-0000", 1), ("x-0001", 1), ("x-0002", 1), ("x-0003", 1)]
    insts[0].label, insts[1].label = "b", "a"
    assert counts() == [("b", 1), ("a", 1), ("x-0002", 1), ("x-0003", 1)]
    insts[0].label, insts[1].label = "a", "b"
    assert counts() == [("a", 1), ("b", 1), ("x-0002", 1), ("x-0003", 1)]
    insts[2].label = "a"
    world.destroy(insts[3])
    world.create_many("vast", 1, label_prefix="")
    assert counts() == [("a", 2), ("b", 1), ("-0000", 1)]
    desc = get(app, order_by=DESC)
    assert list(desc["label_counts"].items()) == [("-0000", 1), ("a", 2), ("b", 1)]


@pytest.mark.parametrize("params", [
    {}, {"order_by": DESC, "limit": 2}, {"select_cols": ["label"]},
    {"order_by": [{"col": "label", "dir": "asc"}], "limit": 3},
])
def test_the_answer_is_the_bytes_json_would_send(world: World, app: VastApp,
                                                 params: dict[str, Any]) -> None:
    world.create_many("vast", 5)
    query = {k: json.dumps(v) for k, v in params.items()}
    resp = app(Request("GET", "/api/v1/instances/", query, {"authorization": f"Bearer {KEY}"},
                       b""))
    assert resp.status == 200 and resp.content_type == "application/json"
    assert resp.body == json.dumps(json.loads(resp.body)).encode()
    assert list(json.loads(resp.body)) == ["success", "instances_found", "total_instances",
                                           "label_counts", "next_token", "instances"]


def test_the_index_starts_over_if_the_world_ever_drops_entries(world: World,
                                                               app: VastApp) -> None:
    """World keeps destroyed instances today; should it ever drop them from
    `World.instances`, even as many as it adds between two pages, the index notices."""
    made = world.create_many("vast", 6)
    get(app)
    for inst in (made[1], made[5]):  # one inside, and the very entry the index read last
        world.destroy(inst)
        del world.instances[inst.key]
    world.create_many("vast", 2, label_prefix="new")  # the same size as before
    body = get(app)
    want = sorted(int(i.id) for i in world.live("vast"))
    assert [r["id"] for r in body["instances"]] == want and app.index.ids == want
