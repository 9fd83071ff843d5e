"""What every standing box must show after a deploy (testinfra, over SSH, any inventory).

Besides what runs, the checks ask whether what the box reports is fresh: a status written
within three ticks, an agent started after its configuration was last written, a RESULT line
within its interval, readings of the node and programs within three ticks of the status, and a
live observer thread. Ages are taken on the box's own clock, so a skewed operator clock never
makes a box look stale or fresh.
"""

from __future__ import annotations

import json
import shlex
import time
import tomllib
from datetime import datetime
from typing import Any

from agent.contract import HOST_KEYS, ROOT, SSH_DIR

AGENT = f"cd {ROOT} && venv/bin/python -m agent"
STALE_TICKS = 3  # a status, reading or observer round older than this many ticks is stale


def agent_json(host: Any, sub: str) -> dict[str, Any]:
    args = "" if sub.startswith("gpu") else f" --config {ROOT}/agent.toml"  # gpu reads none
    out = host.check_output(f"{AGENT} {sub}{args}")
    data = json.loads(out)
    assert isinstance(data, dict)
    return data


def epoch(iso: str | None, what: str) -> float:
    """Seconds since the epoch of one of the agent's UTC ISO-8601 times."""
    assert iso, f"{what}: no time recorded"
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def status_and_clock(host: Any) -> tuple[dict[str, Any], float]:
    """The agent's status and the box's clock right after it was read (one SSH command)."""
    out = host.check_output(f"{AGENT} status --config {ROOT}/agent.toml && "
                            "venv/bin/python -c 'import time; print(time.time())'")
    doc, _, now = out.strip().rpartition("\n")
    status = json.loads(doc)
    assert isinstance(status, dict)
    return status, float(now)


def tick(status: dict[str, Any]) -> float:
    return float(status["agent"]["tick_s"])


def test_agent_runs_with_a_fresh_heartbeat(host: Any) -> None:
    status = agent_json(host, "status")
    assert status["alive"], f"agent not alive: heartbeat {status.get('heartbeat_age_s')}s old"
    pid = status["agent_pid"]
    assert host.process.get(pid=pid).comm.startswith("python")
    assert status["heartbeat_age_s"] <= 3 * status["agent"]["tick_s"] + 5


def running_process(host: Any, prog: dict[str, Any]) -> Any:
    """The live process behind a program the status calls running, or None. The status is the
    agent's last tick: a program restarted since (the miner after a pack export) is gone."""
    if prog["state"] != "running" or not prog["pid"]:
        return None
    procs = host.process.filter(pid=prog["pid"])
    return procs[0] if procs else None


def test_programs_run_under_the_agent(host: Any, box: tuple[str, dict[str, Any]]) -> None:
    status = agent_json(host, "status")
    deadline = time.monotonic() + STALE_TICKS * tick(status) + 5.0
    for name in box[1]["programs"]:
        while True:  # bounded: a restarted program is named with its new pid within a few ticks
            prog = status["programs"][name]
            if prog["needs_gpu"] and not status["admission"]["admitted"]:
                assert prog["pid"] is None and prog["state"] != "running", f"{name} runs unadmitted"
                break
            proc = running_process(host, prog)
            if proc is not None:
                assert prog["binary"].rsplit("/", 1)[-1] in proc.args
                break
            assert time.monotonic() < deadline, \
                f"{name}: {prog['state']} pid {prog['pid']} {prog.get('reason')}"
            time.sleep(0.5)
            status = agent_json(host, "status")


def test_status_is_consistent(host: Any) -> None:
    status = agent_json(host, "status")
    assert status["schema"] == 1
    assert status["agent"]["root"] == ROOT
    pids = [p["pid"] for p in status["programs"].values() if p["pid"]]
    assert len(pids) == len(set(pids))
    node = status["node"]
    assert node["rpc"] is not None, node["rpc_error"]
    assert node["rpc"]["blocks"] >= node["rpc"]["exec_tip"] >= 0
    # the driver in the status is the one the vendor's library (NVML, AMD SMI) reports now
    admission = status["admission"]
    facts = agent_json(host, f"gpu --vendor {admission['vendor']}")
    assert (facts["vendor"], facts["driver"]) == (admission["vendor"], admission["driver"])


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


# --- freshness ---------------------------------------------------------------------------------

def test_status_was_written_within_three_ticks(host: Any) -> None:
    status, now = status_and_clock(host)
    age = now - epoch(status["ts"], "status.ts")
    assert 0 <= age < STALE_TICKS * tick(status), (
        f"status.json written {age:.0f} s ago (tick {tick(status):g} s): the agent's loop is "
        "stuck or the agent is gone")


def test_agent_started_after_its_config_was_written(host: Any) -> None:
    status, _ = status_and_clock(host)
    heartbeat = json.loads(host.file(f"{ROOT}/run/heartbeat").content_string)
    assert heartbeat["pid"] == status["agent_pid"], "the heartbeat is not the live agent's"
    written = float(host.check_output(
        f"{ROOT}/venv/bin/python -c 'import os; print(os.stat(\"{ROOT}/agent.toml\").st_mtime)'"))
    assert heartbeat["started_at"] >= written, (
        f"agent.toml was written {written - heartbeat['started_at']:.0f} s after the agent "
        "started: the running agent has not read it (the deploy must restart it)")


def test_last_result_line_is_within_its_interval(host: Any) -> None:
    status, now = status_and_clock(host)
    lines = [ln for ln in host.file(f"{ROOT}/out/standing.log").content_string.splitlines()
             if ln.startswith("RESULT standing ")]
    assert lines, "no RESULT standing line"
    fields = dict(part.split("=", 1) for part in lines[-1].split()[2:])
    every = float(status["standing"]["every_s"])
    age = now - epoch(fields.get("ts"), "RESULT ts")
    assert 0 <= age <= every + STALE_TICKS * tick(status), (
        f"the last RESULT line is {age:.0f} s old; one is due every {every:g} s")


def test_readings_are_within_three_ticks_of_the_status(host: Any) -> None:
    status, _ = status_and_clock(host)
    limit = STALE_TICKS * tick(status)
    rpc_gap = abs(epoch(status["ts"], "status.ts") - epoch(status["node"]["rpc_at"], "node.rpc_at"))
    assert rpc_gap <= limit, f"the node's RPC was last read {rpc_gap:.0f} s before the status"
    config = tomllib.loads(host.file(f"{ROOT}/agent.toml").content_string)
    deadline = time.monotonic() + limit + 5.0
    for name in status["programs"]:
        source = config.get("programs", {}).get(name, {})
        while True:  # bounded: a program restarted just now is read within a few ticks
            prog = status["programs"][name]
            if not (source.get("status_url") or source.get("status_file")):
                assert prog["reading_at"] is None, f"{name} has no status source, yet a reading"
                break
            if prog["state"] != "running":  # a program not running has no current reading
                assert prog["reading_at"] is None and prog["healthy"] is None, prog
                break
            if prog["reading_at"] is not None or time.monotonic() > deadline:
                gap = abs(epoch(status["ts"], "status.ts")
                          - epoch(prog["reading_at"], f"programs.{name}.reading_at"))
                assert gap <= limit, (f"{name}: its health is judged by a reading {gap:.0f} s "
                                      "older than the status (the observer is stuck)")
                break
            time.sleep(1.0)
            status, _ = status_and_clock(host)


def test_observer_is_alive_and_going_round(host: Any) -> None:
    status, _ = status_and_clock(host)
    observer = status["observer"]
    assert observer["alive"] is True, (
        f"the observer thread is dead (restarts {observer['restarts']}, last error "
        f"{observer['last_error']})")
    gap = abs(epoch(status["ts"], "status.ts") - epoch(observer["round_at"], "observer.round_at"))
    assert gap <= STALE_TICKS * tick(status), f"the observer's last round was {gap:.0f} s ago"


def test_the_ssh_host_keys_kept_under_the_root_are_those_in_etc_ssh(host: Any) -> None:
    """The copy a restart puts back (RunPod's volume outlives the container disk) is the
    box's own host keys, byte for byte and mode for mode: a stale copy would bring back a key
    the fleet no longer pins."""
    kept = f"{ROOT}/{HOST_KEYS}"
    names = host.check_output(f"cd {SSH_DIR} && ls ssh_host_*").split()
    assert "ssh_host_ed25519_key" in names
    assert host.check_output(f"cd {kept} && ls ssh_host_*").split() == names
    for name in names:
        etc, copy = host.file(f"{SSH_DIR}/{name}"), host.file(f"{kept}/{name}")
        assert (copy.sha256sum, copy.mode, copy.user) == (etc.sha256sum, etc.mode, etc.user), name
