"""Fixtures for the fake provider APIs: a frozen clock, a recording backend, live servers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from sandbox.backend import BoxEndpoints, BoxSpec, GpuSpec, NullBackend
from sandbox.daemon import Sandbox
from sandbox.frozen import FrozenClock
from sandbox.world import World


class RecordingBackend:
    """A BoxBackend that records each call; `hold` keeps `start` blocked until released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.specs: dict[str, BoxSpec] = {}
        self.gpus: dict[str, GpuSpec] = {}
        self.hold = threading.Event()
        self.hold.set()
        self.closed = False
        self._null = NullBackend()

    def start(self, spec: BoxSpec) -> BoxEndpoints:
        assert self.hold.wait(30), "start was held too long"
        self.calls.append(("start", spec.box_id))
        self.specs[spec.box_id] = spec
        endpoints = self._null.start(spec)
        endpoints.host_key = f"ssh-ed25519 AAAAC3Nza{spec.box_id}"
        return endpoints

    def destroy(self, box_id: str) -> None:
        self.calls.append(("destroy", box_id))

    def kill(self, box_id: str) -> None:
        self.calls.append(("kill", box_id))

    def restart(self, box_id: str) -> None:
        self.calls.append(("restart", box_id))

    def set_gpu(self, box_id: str, gpu: GpuSpec) -> None:
        self.calls.append(("set_gpu", box_id))
        self.gpus[box_id] = gpu

    def set_sshd_hung(self, box_id: str, hung: bool) -> None:
        self.calls.append(("set_sshd_hung" if hung else "set_sshd_healed", box_id))

    def set_ssh_cut(self, box_id: str, cut: bool) -> None:
        self.calls.append(("set_ssh_cut" if cut else "set_ssh_restored", box_id))

    def close(self) -> None:
        self.closed = True

    def ops(self, box_id: str) -> list[str]:
        return [op for op, box in self.calls if box == box_id]


@pytest.fixture
def clock() -> FrozenClock:
    return FrozenClock()


@pytest.fixture
def backend() -> RecordingBackend:
    return RecordingBackend()


@pytest.fixture
def world(clock: FrozenClock, backend: RecordingBackend) -> Iterator[World]:
    w = World(seed=7, backend=backend, boot_delay=1.0, notice_delay=5.0, clock=clock)
    yield w
    backend.hold.set()
    w.close()


@pytest.fixture
def sbx(clock: FrozenClock, backend: RecordingBackend) -> Iterator[Sandbox]:
    s = Sandbox(seed=7, backend=backend, boot_delay=1.0, notice_delay=5.0, ticker=False,
                clock=clock, poll_interval=0.01)
    yield s
    backend.hold.set()
    s.close()


def boot(world: World) -> None:
    """Let the boot delay pass and every backend call finish."""
    world.advance(world.boot_delay)
    assert world.settle(30)


@pytest.fixture
def booted() -> Callable[[World], None]:
    return boot


@pytest.fixture
def vast(sbx: Sandbox) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {sbx.keys.vast}"}
    with httpx.Client(base_url=sbx.vast.url, headers=headers, timeout=10) as client:
        yield client


class GraphQL:
    def __init__(self, client: httpx.Client, key: str) -> None:
        self.client = client
        self.key = key

    def post(self, query: str, variables: dict[str, Any] | None = None,
             key: str | None = "default") -> httpx.Response:
        headers = {}
        if key is not None:
            headers["Authorization"] = f"Bearer {self.key if key == 'default' else key}"
        body: dict[str, Any] = {"query": query}
        if variables is not None:
            body["variables"] = variables
        return self.client.post("/graphql", json=body, headers=headers)

    def data(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """`data` of a query that must succeed (HTTP 200, no errors)."""
        resp = self.post(query, variables)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert "errors" not in body, body
        data: dict[str, Any] = body["data"]
        return data


@pytest.fixture
def runpod(sbx: Sandbox) -> Iterator[GraphQL]:
    with httpx.Client(base_url=sbx.runpod.url, timeout=10) as client:
        yield GraphQL(client, sbx.keys.runpod)
