"""One sandbox process: the world, both fake provider APIs, the control surface and the store.

`Sandbox` runs in-process (tests use it directly); `serve` runs it until SIGTERM/SIGINT and
keeps `DIR/daemon.json` (pid, ports, URLs) true while it lives. The API keys and the store's
token live in `DIR/keys.json` (mode 0600): reused when present, generated otherwise. The store
(a Hub-compatible server, `sandbox.hub`) keeps its repositories in `DIR/hub/`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandbox.backend import BoxBackend, NullBackend
from sandbox.control import ControlApp
from sandbox.httpbase import App, Server
from sandbox.hub import HubServer, client_env
from sandbox.runpod_api import RunpodApp
from sandbox.vast_api import VastApp
from sandbox.world import World, new_key

log = logging.getLogger(__name__)

BACKENDS = {"null": "sandbox.backend:NullBackend", "ns": "sandbox.boxes:NamespaceBackend"}


def _hub_token() -> str:
    return "hf_" + secrets.token_hex(17)


@dataclass
class Keys:
    runpod: str
    vast: str
    hub: str = field(default_factory=_hub_token)  # the store's token (HF_TOKEN)

    @classmethod
    def generate(cls) -> Keys:
        return cls(runpod=new_key("runpod"), vast=new_key("vast"))

    @classmethod
    def load_or_create(cls, path: Path) -> Keys:
        if path.exists():
            data = json.loads(path.read_text())
            keys = cls(runpod=data["runpod"], vast=data["vast"], hub=data.get("hub") or "")
            if keys.hub:
                return keys
            keys.hub = _hub_token()  # a keys file from before the sandbox had a store
        else:
            keys = cls.generate()
        write_private(path, json.dumps(asdict(keys)))
        return keys


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` (mode 0600) through a temporary file renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def env_vars(info: dict[str, Any], keys: Keys) -> dict[str, str]:
    """The environment that points fleet (and the official SDKs) at a sandbox."""
    env = {
        "RUNPOD_API_BASE_URL": info["runpod_url"],
        "RUNPOD_REST_URL": info["runpod_url"],  # REST v2 (billing) is served there too
        "RUNPOD_API_KEY": keys.runpod,
        "VAST_URL": info["vast_url"],
        "VAST_API_KEY": keys.vast,
        "FLEET_SANDBOX_CONTROL": info["control_url"],
    }
    if info.get("hub_url"):
        env.update(client_env(info["hub_url"], keys.hub))
    return env


def hub_host(backend: BoxBackend) -> str:
    """Where the store listens: the box bridge's gateway when boxes are real, else loopback.

    A box's only route off its namespace is the bridge, and the gateway address on it is this
    machine's own, so one URL serves the operator and the boxes. Never a public interface.
    """
    net = getattr(backend, "net", None)  # the namespace backend's bridge
    gateway = getattr(net, "gateway", None)
    return str(gateway) if gateway is not None else "127.0.0.1"


def make_backend(name: str, state_dir: Path) -> BoxBackend:
    """`null`, `ns` (namespaced SSH hosts from sandbox.boxes), or `module:Class`; a backend
    other than null gets `state_dir/boxes` for its disks, keys and logs."""
    target = BACKENDS.get(name, name)
    if target == BACKENDS["null"]:
        return NullBackend()
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    backend: BoxBackend = cls(state_dir=state_dir / "boxes")
    return backend


class Sandbox:
    """The world and the servers, started together and closed together; the store (a Hub
    server on `hub_host`) runs when `hub_root` names where it keeps its repositories."""

    def __init__(
        self,
        seed: int = 0,
        keys: Keys | None = None,
        backend: BoxBackend | None = None,
        boot_delay: float = 1.0,
        notice_delay: float = 5.0,
        machines_per_provider: int = 16,
        ports: tuple[int, int, int] = (0, 0, 0),
        ticker: bool = True,
        clock: Callable[[], float] = time.time,
        poll_interval: float = 0.1,  # how long closing a server may take
        hub_root: Path | None = None,
        hub_host: str = "127.0.0.1",
        hub_port: int = 0,
    ) -> None:
        self.keys = keys or Keys.generate()
        self.world = World(seed, machines_per_provider, backend, boot_delay, notice_delay, clock)
        apps: tuple[App, App, App] = (RunpodApp(self.world, self.keys.runpod),
                                      VastApp(self.world, self.keys.vast), ControlApp(self.world))
        self.runpod, self.vast, self.control = (
            Server(app, port, poll_interval) for app, port in zip(apps, ports, strict=True)
        )
        self.hub = HubServer(hub_root, self.keys.hub, hub_host, hub_port, poll_interval) \
            if hub_root is not None else None
        if ticker:
            self.world.start_ticker()

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "pid": os.getpid(),
            "seed": self.world.seed,
            "runpod_url": self.runpod.url,
            "vast_url": self.vast.url,
            "control_url": self.control.url,
            "ports": {"runpod": self.runpod.port, "vast": self.vast.port,
                      "control": self.control.port},
        }
        if self.hub is not None:
            info["hub_url"] = self.hub.url
            info["ports"]["hub"] = self.hub.port
        return info

    def env(self) -> dict[str, str]:
        return env_vars(self.info(), self.keys)

    def close(self) -> None:
        servers: list[Server | HubServer] = [self.runpod, self.vast, self.control]
        if self.hub is not None:
            servers.append(self.hub)
        closers = [threading.Thread(target=s.close) for s in servers]
        for t in closers:  # each shutdown waits out a poll interval: overlap them
            t.start()
        for t in closers:
            t.join()
        self.world.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(state_dir: Path, seed: int = 0, backend: str = "null", boot_delay: float = 1.0,
          notice_delay: float = 5.0, machines_per_provider: int = 16) -> None:
    """Run the sandbox in this process until SIGTERM or SIGINT."""
    state_dir.mkdir(parents=True, exist_ok=True)
    keys = Keys.load_or_create(state_dir / "keys.json")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    boxes = make_backend(backend, state_dir)  # the namespace backend brings its bridge up here
    sandbox = Sandbox(seed, keys, boxes, boot_delay, notice_delay, machines_per_provider,
                      hub_root=state_dir / "hub", hub_host=hub_host(boxes))
    info_path = state_dir / "daemon.json"
    try:
        write_private(info_path, json.dumps({**sandbox.info(), "backend": backend}, indent=2))
        log.info("sandbox up: %s", sandbox.info())
        stop.wait()
    finally:
        log.info("sandbox stopping")
        info_path.unlink(missing_ok=True)
        sandbox.close()
