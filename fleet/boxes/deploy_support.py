"""What the deploy files need from the operator's side, computed once per pyinfra run.

A deploy file is exec'd once per host (concurrently, in greenlets), so everything here is
memoised per process: the config, the agent bundle, release tarballs. Each builder runs under an
in-process lock first (gevent makes it greenlet-aware): the builders also take a file lock, and
a second greenlet blocking in flock would stall the whole process while the first one waits.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from fleet.boxes import bundle as bundle_mod
from fleet.core import job as job_mod
from fleet.core.config import Config, host_network, load
from fleet.core.errors import ConfigError
from fleet.core.fileutil import write_atomic
from fleet.core.tarball import Entry, deterministic_tar
from fleet.state import releases

if TYPE_CHECKING:
    from fleet.core.job import Job

_LOCK = threading.RLock()
DEFAULT_ENDPOINT = "https://huggingface.co"


T = TypeVar("T")


def once(fn: Callable[..., T]) -> Callable[..., T]:
    """functools.cache, with concurrent first calls serialised (positional arguments only)."""
    cached = functools.cache(fn)

    @functools.wraps(fn)
    def wrapper(*args: str) -> T:
        with _LOCK:
            return cached(*args)

    return wrapper


@once
def config() -> Config:
    return load()


def cache_dir() -> Path:
    return config().registry.parent / "cache"


@once
def agent_bundle() -> bundle_mod.Bundle:
    return bundle_mod.build(cache_dir())


@dataclass(frozen=True)
class ShippedRelease:
    release: releases.Release
    tarball: Path
    sha256sums: str  # sha256sum -c input, names relative to the release folder


@once
def release(version: str) -> ShippedRelease:
    r = releases.find(config().releases, version)
    entries = []
    for name in sorted(r.sha256):
        data = (r.path / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != r.sha256[name]:
            raise ConfigError(
                f"release {r.version}: {name} does not match releases.json; rebuild the store")
        entries.append(Entry(name, data, 0o755))
    out = cache_dir() / f"release-{r.node_sha16}.tar"
    if not out.exists():
        write_atomic(out, deterministic_tar(entries))
    sums = "".join(f"{r.sha256[e.name]}  {e.name}\n" for e in entries)
    return ShippedRelease(r, out, sums)


class Mesh:
    """The standing boxes' public p2p endpoints by network (a box's host data `network`),
    gathered and sorted once for a run: each host's peers file is then the other endpoints of
    its network, not a pass over every host."""

    def __init__(self, hosts: list[tuple[str, dict[str, object]]]) -> None:
        self.network = {name: host_network(d) for name, d in hosts}
        self.members: dict[str, list[tuple[str, str]]] = {}
        for name, d in hosts:
            if d.get("public_ip") and d.get("p2p_public_port"):
                self.members.setdefault(host_network(d), []).append(
                    (f"{d['public_ip']}:{d['p2p_public_port']}\n", name))
        for lines in self.members.values():
            lines.sort()

    def text(self, self_name: str) -> str:
        """HOST:PORT lines, sorted, of the other boxes of `self_name`'s network (a box of
        another network runs another network's node); empty for a host not in the run."""
        if self_name not in self.network:
            return ""
        return "".join(line for line, name in self.members.get(self.network[self_name], [])
                       if name != self_name)


def peers_text(self_name: str, hosts: list[tuple[str, dict[str, object]]]) -> str:
    """The peers file of `self_name` among `hosts` (`Mesh.text`)."""
    return Mesh(hosts).text(self_name)


@once
def inventory_mesh() -> Mesh:
    """The mesh of this pyinfra run's standing group (the inventory is fixed for a run)."""
    from pyinfra import inventory

    return Mesh([(h.name, dict(h.data.dict())) for h in inventory.get_group("standing")])


@once
def job(path: str) -> Job:
    return job_mod.load(Path(path))


@once
def job_inputs(path: str) -> bytes | None:
    """The job's input folder as a tarball (None without one): its input_files."""
    j = job(path)
    if j.inputs is None:
        return None
    entries = [Entry(p.relative_to(j.inputs).as_posix(), p.read_bytes(),
                     0o755 if p.stat().st_mode & 0o111 else 0o644)
               for p in j.input_files()]
    return deterministic_tar(entries)


def store_endpoint(cfg: Config | None = None) -> str:
    """The store's URL as the boxes reach it: HF_ENDPOINT, else fleet.toml's, else the Hub."""
    return os.environ.get("HF_ENDPOINT") or (cfg or config()).store.get("endpoint") \
        or DEFAULT_ENDPOINT


def store_token() -> str | None:
    """The operator's store token (HF_TOKEN or huggingface_hub's token file), never printed."""
    from fleet.providers import store

    return store.token()
