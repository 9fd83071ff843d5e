"""`fleet sandbox up|status|fault|down` as plain functions: a real background daemon."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from sandbox import manage


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / ".sandbox"
    yield path
    manage.down(path)  # never leave a daemon behind, whatever the test did


def test_up_status_fault_down(state_dir: Path) -> None:
    info = manage.up(state_dir, seed=5, boot_delay=0.01)
    assert info["started"] is True and psutil.pid_exists(info["pid"])
    env_file = state_dir / "env"
    assert stat.S_IMODE(os.stat(env_file).st_mode) == 0o600
    env = manage.load_env(state_dir)
    assert sorted(env) == ["FLEET_SANDBOX_CONTROL", "HF_ENDPOINT", "HF_HUB_DISABLE_TELEMETRY",
                           "HF_HUB_DISABLE_XET", "HF_TOKEN", "RUNPOD_API_BASE_URL",
                           "RUNPOD_API_KEY", "RUNPOD_REST_URL", "VAST_API_KEY", "VAST_URL"]
    assert all(line.startswith(("#", "export ")) for line in env_file.read_text().splitlines())
    assert env["VAST_URL"].startswith("http://127.0.0.1:")

    again = manage.up(state_dir)
    assert again["started"] is False and again["pid"] == info["pid"]
    assert manage.load_env(state_dir) == env

    auth = {"Authorization": f"Bearer {env['VAST_API_KEY']}"}
    assert httpx.get(f"{env['VAST_URL']}/api/v1/instances/", headers=auth).status_code == 200
    gql = httpx.post(f"{env['RUNPOD_API_BASE_URL']}/graphql",
                     json={"query": "query { myself { pods { id } } }"},
                     headers={"Authorization": f"Bearer {env['RUNPOD_API_KEY']}"})
    assert gql.json() == {"data": {"myself": {"pods": []}}}

    status = manage.status(state_dir)
    assert status["running"] is True and status["healthy"] is True
    assert status["instances"] == {"runpod": 0, "vast": 0} and status["seed"] == 5

    queued = manage.fault(state_dir, "rate_limit", "vast", count=2)
    assert queued["queued"]["count"] == 2
    assert httpx.get(f"{env['VAST_URL']}/api/v1/instances/", headers=auth).status_code == 429

    out = manage.down(state_dir)
    assert out == {"stopped": True, "pid": info["pid"]}
    assert not psutil.pid_exists(info["pid"]) or psutil.Process(info["pid"]).status() == (
        psutil.STATUS_ZOMBIE)
    assert not env_file.exists() and not (state_dir / "daemon.json").exists()
    assert manage.status(state_dir)["running"] is False
    assert manage.down(state_dir)["stopped"] is False


def test_fault_needs_a_running_sandbox(state_dir: Path) -> None:
    with pytest.raises(manage.SandboxError, match="not running"):
        manage.fault(state_dir, "rate_limit", "vast")


def test_a_daemon_that_cannot_start_is_reported_in_its_own_words(state_dir: Path) -> None:
    state_dir.mkdir(parents=True)
    (state_dir / "daemon.log").write_text("an earlier run's last words\n")
    with pytest.raises(manage.SandboxError,
                       match="exited with status 1: .*ModuleNotFoundError") as refused:
        manage.up(state_dir, backend="no.such.module:Backend", timeout=600)
    assert "earlier run" not in str(refused.value)
