"""The providers' own official clients work against the fakes, unchanged, through their env vars.

Each runs in a subprocess whose environment is the sandbox's `env` (vastai reads `VAST_URL` at
import; importing runpod reconfigures the root logger). The runpod SDK is pinned to 1.10.0:
1.12.0 needs paramiko>=5, which pyinfra's pin excludes; the `runpod/api` package (queries,
mutations and `run_graphql_query`) is byte-identical between 1.10.0 and 1.12.0, so these are
the exact documents 1.12.0 sends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.daemon import Sandbox

VAST_SDK_SCRIPT = r"""
import json, time
from vastai import VastAI

v = VastAI(raw=True)  # key from VAST_API_KEY, server from VAST_URL
out = {}
offers = v.search_offers("driver_version=580.95.05 num_gpus=1 direct_port_count>=2",
                         order="dph_total")
out["drivers"] = sorted({o["driver_version"] for o in offers})
out["offers"] = len(offers)
made = v.create_instance(offers[0]["id"], image="ubuntu:22.04", disk=20, label="sdk",
                         ssh=True, direct=True, env="-p 26611:26611 -e ROLE=live",
                         onstart_cmd="echo hello")
iid = made["new_contract"]
out["created"] = made["success"]
deadline = time.monotonic() + 30
while True:
    row = v.show_instance(iid)
    if row["actual_status"] == "running" or time.monotonic() > deadline:
        break
    time.sleep(0.02)
out["status"] = row["actual_status"]
out["ports"] = sorted(row["ports"])
out["extra_env"] = row["extra_env"]
out["ssh_url"] = v.ssh_url(iid)
out["listed"] = [r["id"] for r in v.show_instances()]
out["label"] = v.label_instance(iid, "renamed")["success"]
out["stop"] = v.stop_instance(iid)["success"]
out["destroy"] = v.destroy_instance(iid)["success"]
out["after"] = v.show_instance(iid)
out["iid"] = iid
print(json.dumps(out))
"""


RUNPOD_SDK_SCRIPT = r"""
import json, os, time, urllib.request
import runpod
from runpod import error

runpod.api_key = os.environ["RUNPOD_API_KEY"]  # the SDK reads no env var for its key
control = os.environ["FLEET_SANDBOX_CONTROL"]

def fault(kind, target):
    req = urllib.request.Request(control + "/faults", method="POST",
                                 data=json.dumps({"kind": kind, "target": target}).encode())
    urllib.request.urlopen(req).read()

out = {"gpus": runpod.get_gpus(), "gpu": runpod.get_gpu("NVIDIA GeForce RTX 4090")}
pod = runpod.create_pod("sdk", "runpod/base:0.6.2", "NVIDIA GeForce RTX 4090",
                        ports="22/tcp,8888/http", env={"ROLE": "live"},
                        allowed_cuda_versions=["13.0"])
out["created"] = pod
deadline = time.monotonic() + 30
while True:
    got = runpod.get_pod(pod["id"])
    if got["runtime"] or time.monotonic() > deadline:
        break
    time.sleep(0.02)
out["got"] = got
out["listed"] = [p["id"] for p in runpod.get_pods()]
out["stopped"] = runpod.stop_pod(pod["id"])
out["resumed"] = runpod.resume_pod(pod["id"], 1)["desiredStatus"]
runpod.terminate_pod(pod["id"])
out["after"] = runpod.get_pod(pod["id"])
out["after_list"] = runpod.get_pods()
fault("no_capacity", "podFindAndDeployOnDemand")
try:
    runpod.create_pod("x", "img", "NVIDIA GeForce RTX 4090")
except error.QueryError as exc:
    out["no_capacity"] = str(exc)
try:
    runpod.terminate_pod(pod["id"])
except error.QueryError as exc:
    out["terminate_again"] = str(exc)
runpod.api_key = "wrong"
try:
    runpod.get_pods()
except error.AuthenticationError as exc:
    out["bad_key"] = type(exc).__name__
print(json.dumps(out))
"""


@pytest.fixture
def live() -> Iterator[Sandbox]:
    """A sandbox on the real clock, as a separate client process sees it."""
    with Sandbox(seed=11, boot_delay=0.0, poll_interval=0.01) as sandbox:
        yield sandbox


def client_env(sandbox: Sandbox, tmp_path: Path) -> dict[str, str]:
    # HOME is empty so no key file of the machine's user leaks in
    return {**os.environ, **sandbox.env(), "HOME": str(tmp_path)}


def run(cmd: list[str], env: dict[str, str]) -> Any:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_vastai_sdk_unchanged(live: Sandbox, tmp_path: Path) -> None:
    out = run([sys.executable, "-c", VAST_SDK_SCRIPT], client_env(live, tmp_path))
    expected = [o for o in live.world.machines["vast"] if o.driver == "580.95.05"
                and o.direct_port_count >= 2]
    assert out["drivers"] == ["580.95.05"] and out["offers"] == len(expected)
    assert out["created"] is True and out["status"] == "running"
    assert out["ports"] == ["22/tcp", "26611/tcp"]
    assert out["extra_env"] == {"-p 26611:26611": "1", "ROLE": "live"}
    assert out["ssh_url"].startswith("ssh://root@10.77.1.")
    assert out["listed"] == [out["iid"]]
    assert out["label"] and out["stop"] and out["destroy"]
    assert out["after"] is None
    assert live.world.live("vast") == []


def test_vastai_cli_driver_filter(live: Sandbox, tmp_path: Path) -> None:
    cli = str(Path(sys.executable).with_name("vastai"))
    env = client_env(live, tmp_path)
    for driver in ("580.95.05", "570.172.08"):
        rows = run([cli, "search", "offers", f"driver_version={driver}", "--raw"], env)
        want = sum(1 for m in live.world.machines["vast"] if m.driver == driver)
        assert {r["driver_version"] for r in rows} == {driver}
        assert len({r["machine_id"] for r in rows}) == want


def test_runpod_sdk_unchanged(live: Sandbox, tmp_path: Path) -> None:
    out = run([sys.executable, "-c", RUNPOD_SDK_SCRIPT], client_env(live, tmp_path))
    assert {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24} in (
        out["gpus"])
    assert out["gpu"]["lowestPrice"]["uninterruptablePrice"] > 0
    assert out["created"]["env"] == ["ROLE=live"] and out["created"]["machine"]["podHostId"]
    pod_id = out["created"]["id"]
    assert out["got"]["desiredStatus"] == "RUNNING" and out["got"]["ports"] == "22/tcp,8888/http"
    assert {p["privatePort"] for p in out["got"]["runtime"]["ports"]} == {22, 8888}
    assert out["listed"] == [pod_id]
    assert out["stopped"] == {"id": pod_id, "desiredStatus": "EXITED"}
    assert out["resumed"] == "RUNNING"
    assert out["after"] is None and out["after_list"] == []
    assert "no longer any instances available" in out["no_capacity"]
    assert out["terminate_again"] == "pod not found to terminate"
    assert out["bad_key"] == "AuthenticationError"
    assert live.world.live("runpod") == []
