"""The Hub client pointed at the sandbox's Hub server, as `.sandbox/env` points it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from sandbox.hub import HubServer, client_env

TOKEN = "hf_sandbox_store_token_9876543210"


def point_client(monkeypatch: pytest.MonkeyPatch, url: str, home: Path) -> None:
    """The environment `.sandbox/env` gives, and the library's copies of what it reads at
    import (which may have happened before this test)."""
    for name, value in {**client_env(url, TOKEN), "HF_HOME": str(home)}.items():
        monkeypatch.setenv(name, value)
    library: dict[str, object] = {
        "ENDPOINT": url,
        "HUGGINGFACE_CO_URL_TEMPLATE": url + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_HUB_DISABLE_XET": True, "HF_HUB_DISABLE_TELEMETRY": True, "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"), "HF_TOKEN_PATH": str(home / "token"),
        "HF_STORED_TOKENS_PATH": str(home / "stored_tokens"),
    }
    for name, setting in library.items():
        monkeypatch.setattr(constants, name, setting)


def hub_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A sandbox Hub server under tmp_path with the client pointed at it (a fixture's body:
    `yield from hub_server(tmp_path, monkeypatch)`)."""
    server = HubServer(tmp_path / "hub", TOKEN, poll_interval=0.01)
    point_client(monkeypatch, server.url, tmp_path / "hf-home")
    yield server
    server.close()
