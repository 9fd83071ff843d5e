"""The release store the fleet publishes from: `releases.json` beside one folder per version.

    <store>/releases.json  [{"version", "files": {name: {"sha256", "sha16", "size"}}, ...}]
    <store>/<version>/{igneumd, igneum-miner, igneum-prover}

A release is addressed on boxes by its node binary's sha16 (`/root/fleet/releases/<sha16>/`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fleet.errors import ConfigError

NODE = "igneumd"


@dataclass(frozen=True)
class Release:
    version: str
    path: Path
    sha256: dict[str, str]  # file name -> sha256

    @property
    def node_sha256(self) -> str:
        return self.sha256[NODE]

    @property
    def node_sha16(self) -> str:
        return self.node_sha256[:16]


def load(store: Path) -> list[Release]:
    manifest = store / "releases.json"
    try:
        rows = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{manifest}: no release store here") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{manifest}: not valid JSON: {e}") from None
    return [Release(r["version"], store / r["version"],
                    {n: f["sha256"] for n, f in r["files"].items()}) for r in rows]


def find(store: Path, version: str) -> Release:
    releases = load(store)
    for r in releases:
        if r.version == version or r.node_sha16 == version:
            return r
    known = ", ".join(r.version for r in releases) or "none"
    raise ConfigError(f"no release {version!r} in {store} (known: {known})")
