"""What every standing box must show after a deploy (testinfra, over SSH, any inventory)."""

from __future__ import annotations

import json
import shlex
from typing import Any

ROOT = "/root/fleet"
AGENT = f"cd {ROOT} && venv/bin/python -m agent"


def agent_json(host: Any, sub: str) -> dict[str, Any]:
    args = "" if sub == "gpu" else f" --config {ROOT}/agent.toml"  # gpu reads no config
    out = host.check_output(f"{AGENT} {sub}{args}")
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def test_agent_runs_with_a_fresh_heartbeat(host: Any) -> None:
    status = agent_json(host, "status")
    assert status["alive"], f"agent not alive: heartbeat {status.get('heartbeat_age_s')}s old"
    pid = status["agent_pid"]
    assert host.process.get(pid=pid).comm.startswith("python")
    assert status["heartbeat_age_s"] <= 3 * status["agent"]["tick_s"] + 5


def test_programs_run_under_the_agent(host: Any, box: tuple[str, dict[str, Any]]) -> None:
    status = agent_json(host, "status")
    admitted = status["admission"]["admitted"]
    for name in box[1]["programs"]:
        prog = status["programs"][name]
        if prog["needs_gpu"] and not admitted:
            assert prog["pid"] is None and prog["state"] != "running", f"{name} runs unadmitted"
            continue
        assert prog["state"] == "running", f"{name}: {prog['state']} {prog.get('reason')}"
        proc = host.process.get(pid=prog["pid"])  # the pid the status names is alive
        assert prog["binary"].rsplit("/", 1)[-1] in proc.args


def test_status_is_consistent(host: Any) -> None:
    status = agent_json(host, "status")
    assert status["schema"] == 1
    assert status["agent"]["root"] == ROOT
    pids = [p["pid"] for p in status["programs"].values() if p["pid"]]
    assert len(pids) == len(set(pids))
    node = status["node"]
    assert node["rpc"] is not None, node["rpc_error"]
    assert node["rpc"]["blocks"] >= node["rpc"]["exec_tip"] >= 0
    # the driver in the status is the one NVML reports now
    assert agent_json(host, "gpu")["driver"] == status["admission"]["driver"]


def test_result_line_present(host: Any) -> None:
    log = host.file(f"{ROOT}/out/standing.log")
    assert log.exists
    lines = [ln for ln in log.content_string.splitlines() if ln.startswith("RESULT standing ")]
    assert lines, "no RESULT standing line yet"
    fields = dict(part.split("=", 1) for part in shlex.split(lines[-1])[2:])
    assert fields["node_pid"] != "-" and fields["admission"] in ("ok", "refused")


def test_pointer_and_running_binary_agree(host: Any) -> None:
    pointer = host.file(f"{ROOT}/standing.node").content_string.strip()
    digest = host.file(f"{ROOT}/standing.node.sha256").content_string.strip()
    assert host.file(pointer).exists and host.file(pointer).mode & 0o111
    assert host.check_output(f"sha256sum {shlex.quote(pointer)}").split()[0] == digest
    status = agent_json(host, "status")
    assert status["node"]["binary"] == pointer
    assert status["node"]["sha16"] == digest[:16]
    assert status["programs"]["node"]["sha16"] == digest[:16]


def test_p2p_port_listening(host: Any, box: tuple[str, dict[str, Any]]) -> None:
    port = box[1]["p2p_port"]
    # a TCP connect from the box itself (many images have neither ss nor netstat)
    probe = host.run(f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", "
                     f"{port}), 5).close()'")
    assert probe.rc == 0, f"nothing listens on {port}: {probe.stderr}"
    ports = agent_json(host, "ports")
    assert ports["mapped"] and int(ports["public_port"]) == int(box[1]["p2p_public_port"])


def test_agent_config_is_private(host: Any) -> None:
    f = host.file(f"{ROOT}/agent.toml")
    assert f.user == "root" and f.mode == 0o600
