"""The agent's pieces on their own: config, templates, backoff, ports, pointer, rotation,
manifest, process matching, the RESULT line."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from repo_root import ROOT

from agent.base.config import load_config, parse_config
from agent.base.errors import AgentError
from agent.base.files import DigestCache
from agent.base.identity import matcher_for
from agent.base.manifest import manifest
from agent.base.pointer import check_pointer, read_pointer
from agent.base.ports import find_p2p
from agent.base.procs import executable_arg
from agent.base.template import render_argv, render_env
from agent.contract import Layout
from agent.daemon.backoff import Backoff
from agent.daemon.rotation import rotate_if_big
from agent.daemon.status import result_line

DOC_EXAMPLE = ROOT / "docs" / "agent.md"


def write(tmp: Path, text: str) -> Path:
    path = tmp / "agent.toml"
    path.write_text(text)
    return path


MINIMAL = '[programs.node]\ncommand = "{node_bin} --p2p={p2p_public_ip}:{p2p_public_port}"\n'


# ---------------------------------------------------------------- config

def test_minimal_config_takes_the_documented_defaults(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, MINIMAL))
    assert cfg.root == Path("/root/fleet")
    assert (cfg.tick_s, cfg.stable_s, cfg.reconcile_s, cfg.result_every_s) == (15, 10, 60, 600)
    assert (cfg.backoff_base_s, cfg.backoff_cap_s) == (1, 300)
    assert cfg.recovery.min_blocks == 1000 and cfg.recovery.recipe == ()
    node = cfg.programs["node"]
    assert node.command == ("{node_bin}", "--p2p={p2p_public_ip}:{p2p_public_port}")
    assert node.cwd == "{root}" and node.log == "{root}/log/node.log"
    assert node.needs_gpu is False


def test_the_example_in_the_docs_is_a_valid_config(tmp_path: Path) -> None:
    text = DOC_EXAMPLE.read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    cfg = load_config(write(tmp_path, example))
    assert set(cfg.programs) == {"node", "miner", "prover"}
    assert cfg.programs["miner"].needs_gpu and not cfg.programs["node"].needs_gpu
    assert cfg.recovery.recipe and cfg.miner_pack.command


@pytest.mark.parametrize("text, message", [
    ("tick_s = 'fast'\n" + MINIMAL, "tick_s must be a number"),
    ("tik_s = 1\n" + MINIMAL, "unknown key 'tik_s'"),
    ("root = 'relative'\n" + MINIMAL, "root must be an absolute path"),
    ("[programs.node]\ncwd = '/'\n", "programs.node.command is required"),
    ("[programs.node]\ncommand = '{nod_bin}'\n", "unknown placeholder {nod_bin}"),
    ("[programs.node]\ncommand = 'x'\nmatch = '('\n", "not a regular expression"),
    ("[programs.node]\ncommand = 'x'\nneeds_gpu = 'yes'\n", "must be true or false"),
    ("[programs.Node]\ncommand = 'x'\n", "program name 'Node'"),
    ("[recovery]\nrecipe = 'x {seed}'\n", "unknown placeholder {seed}"),
    ("[programs.node]\ncommand = 'x'\nstatus_url = 'https://x/'\n", "only http://"),
    ("backoff_base_s = 10\nbackoff_cap_s = 5\n" + MINIMAL, "backoff_cap_s is below"),
    ("tick_s = [\n", "not valid TOML"),
])
def test_bad_configs_are_refused_with_a_reason(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(AgentError) as err:
        load_config(write(tmp_path, text))
    assert message in str(err.value)
    assert err.value.exit_code == 2


def test_a_bad_config_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    path = write(tmp_path, "tick_s = -1\n" + MINIMAL)
    for command in ("run", "status", "admit", "ports", "stop"):
        done = subprocess.run([sys.executable, "-m", "agent", command, "--config", str(path)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, command
        assert done.stdout == "" and done.stderr.count("\n") == 1
        assert done.stderr.startswith("error: ") and "tick_s" in done.stderr
    missing = subprocess.run([sys.executable, "-m", "agent", "status", "--config",
                              str(tmp_path / "nope.toml")], capture_output=True, text=True)
    assert missing.returncode == 2 and "not found" in missing.stderr
    unknown = subprocess.run([sys.executable, "-m", "agent", "fly"], capture_output=True,
                             text=True)
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1


# ---------------------------------------------------------------- templates

def test_arguments_naming_an_unknown_value_are_left_out() -> None:
    values = {"root": "/r", "node_bin": "/r/releases/ab/node", "p2p_public_ip": None,
              "p2p_public_port": None, "p2p_port": "16111"}
    argv = render_argv(["{node_bin}", "--listen=0.0.0.0:{p2p_port}",
                        "--external={p2p_public_ip}:{p2p_public_port}", "--data={root}/d"], values)
    assert argv == ["/r/releases/ab/node", "--listen=0.0.0.0:16111", "--data=/r/d"]
    split = render_argv(["{node_bin}", "-v", "--p2p-public", "{p2p_public_ip}:{p2p_public_port}",
                         "--port", "{p2p_port}"], values)
    assert split == ["/r/releases/ab/node", "-v", "--port", "16111"]  # the option goes too
    env = render_env({"A": "{root}", "B": "{p2p_public_ip}", "C": "{{literal}}"}, values)
    assert env == {"A": "/r", "C": "{literal}"}


# ---------------------------------------------------------------- backoff

def test_backoff_doubles_from_the_base_with_jitter_up_to_the_cap() -> None:
    b = Backoff(base_s=1.0, cap_s=300.0, jitter=0.2)
    rng = random.Random(7)
    for failures, nominal in [(1, 1), (2, 2), (3, 4), (5, 16), (9, 256)]:
        delays = [b.delay(failures, rng) for _ in range(200)]
        assert min(delays) >= nominal * 0.8 and max(delays) <= nominal * 1.2
        assert len({round(d, 6) for d in delays}) > 100  # jittered, not one fixed value
    assert all(b.delay(n, rng) <= 300.0 for n in range(1, 200))
    assert min(b.delay(50, rng) for _ in range(200)) >= 240.0  # retried at the cap, forever


# ---------------------------------------------------------------- ports

@pytest.mark.parametrize("env, expected", [
    ({"RUNPOD_PUBLIC_IP": "203.0.113.7", "RUNPOD_TCP_PORT_16111": "40111"},
     ("runpod", "203.0.113.7", 40111)),
    ({"PUBLIC_IPADDR": " 198.51.100.4 \n", "VAST_TCP_PORT_16111": "33016"},
     ("vast", "198.51.100.4", 33016)),
])
def test_p2p_mapping_from_the_provider_environment(env: dict[str, str],
                                                   expected: tuple[str, str, int]) -> None:
    m = find_p2p(16111, env)
    assert m.mapped and (m.provider, m.public_ip, m.public_port) == expected


@pytest.mark.parametrize("env, port, reason", [
    ({}, 16111, "no provider port environment"),
    ({"RUNPOD_PUBLIC_IP": "203.0.113.7", "RUNPOD_TCP_PORT_22": "40022"}, 16111,
     "RUNPOD_TCP_PORT_16111 is not set"),
    ({"VAST_TCP_PORT_16111": "33016"}, 16111, "PUBLIC_IPADDR is not set"),
    ({"RUNPOD_PUBLIC_IP": "1.2.3.4", "RUNPOD_TCP_PORT_16111": "x"}, 16111, "is not a port"),
    ({"RUNPOD_PUBLIC_IP": "1.2.3.4"}, 0, "no p2p_port configured"),
])
def test_no_mapping_says_why(env: dict[str, str], port: int, reason: str) -> None:
    m = find_p2p(port, env)
    assert not m.mapped and m.public_port is None and reason in (m.reason or "")


# ---------------------------------------------------------------- pointer

def test_pointer_verdicts(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    binary = tmp_path / "releases" / "x" / "node"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"#!/bin/sh\n")
    binary.chmod(0o755)
    sha = hashlib.sha256(binary.read_bytes()).hexdigest()
    assert read_pointer(layout) is None
    cache = DigestCache()

    def verdict(target: str, digest: str) -> tuple[bool, str | None]:
        layout.pointer.write_text(target + "\n")
        layout.pointer_digest.write_text(digest)
        pointer = read_pointer(layout)
        assert pointer is not None
        v = check_pointer(pointer, cache.digest)
        return v.ok, v.reason

    assert verdict(str(binary), sha + "  node\n") == (True, None)  # sha256sum format accepted
    assert "not an absolute path" in (verdict("releases/x/node", sha)[1] or "")
    assert "does not exist" in (verdict(str(binary) + "2", sha)[1] or "")
    assert "missing or empty" in (verdict(str(binary), "")[1] or "")
    assert "not a sha256" in (verdict(str(binary), "abc")[1] or "")
    assert "standing.node.sha256 says" in (verdict(str(binary), "f" * 64)[1] or "")
    binary.chmod(0o644)
    assert "not executable" in (verdict(str(binary), sha)[1] or "")


# ---------------------------------------------------------------- rotation and manifest

def test_copytruncate_rotation_keeps_the_writer_appending(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b"a" * 2000)
        assert rotate_if_big(log, 1000, keep=2)
        os.write(fd, b"b" * 10)  # the same descriptor, after the truncate
        assert log.read_bytes() == b"b" * 10
        assert (tmp_path / "p.log.1").read_bytes() == b"a" * 1000  # the tail within the limit
        os.write(fd, b"c" * 2000)
        assert rotate_if_big(log, 1000, keep=2)
        os.write(fd, b"d" * 2000)
        assert rotate_if_big(log, 1000, keep=2)
        assert (tmp_path / "p.log.2").read_bytes() == b"c" * 1000
        assert (tmp_path / "p.log.1").read_bytes() == b"d" * 1000
        assert not (tmp_path / "p.log.3").exists()
        assert not rotate_if_big(log, 1000, keep=2)
    finally:
        os.close(fd)


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path: Path) -> None:
    (tmp_path / "out" / "sub").mkdir(parents=True)
    (tmp_path / "out" / "b.txt").write_bytes(b"hello")
    (tmp_path / "out" / "sub" / "a.bin").write_bytes(b"\0" * 10)
    (tmp_path / "out" / "link").symlink_to(tmp_path / "out" / "b.txt")
    entries = manifest(tmp_path / "out")
    assert entries == [
        {"path": "b.txt", "size": 5, "sha256": hashlib.sha256(b"hello").hexdigest()},
        {"path": "link", "link": str(tmp_path / "out" / "b.txt")},  # named, never followed
        {"path": "sub/a.bin", "size": 10, "sha256": hashlib.sha256(b"\0" * 10).hexdigest()},
    ]
    done = subprocess.run([sys.executable, "-m", "agent", "manifest", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == entries
    bad = subprocess.run([sys.executable, "-m", "agent", "manifest",
                          str(tmp_path / "out" / "b.txt")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "is not a directory" in bad.stderr


# ---------------------------------------------------------------- process identity

def test_default_matching_is_specific_to_the_root(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    cfg = parse_config({"root": str(root), "admitted_driver": "580.95.05", "programs": {
        "node": {"command": "{node_bin} --x"},
        "miner": {"command": f"python3 {root}/in/miner.py --y"},
    }}, tmp_path / "agent.toml")
    values = {"root": str(root), "node_bin": f"{root}/releases/aaaa/node"}
    node = matcher_for(cfg, "node", values)
    miner = matcher_for(cfg, "miner", values)
    assert node is not None and miner is not None
    assert node(0, [f"{root}/releases/aaaa/node", "--x"])
    assert node(0, ["python3", f"{root}/releases/bbbb/node"])  # a newer release, by hand
    assert not node(0, ["/usr/bin/node", "server.js"])  # nodejs is not our node
    assert not node(0, [f"{tmp_path}/other/releases/aaaa/node"])  # another root's node
    assert miner(0, ["/usr/bin/python3", f"{root}/in/miner.py"])
    assert not miner(0, ["python3", f"{tmp_path}/elsewhere/miner.py"])
    assert executable_arg(["python3", "-u", "/x/miner.py"]) == "/x/miner.py"
    assert executable_arg(["/x/node", "--flag"]) == "/x/node"


def test_programs_sharing_one_file_are_told_apart_by_arguments(tmp_path: Path) -> None:
    cfg = parse_config({"root": str(tmp_path), "admitted_driver": "580.95.05", "programs": {
        "miner": {"command": "/opt/prog.sh --role miner"},
        "prover": {"command": "/opt/prog.sh --role prover"},
        "other": {"command": "/opt/other --flags {root}"},
    }}, tmp_path / "agent.toml")
    values = {"root": str(tmp_path), "node_bin": None}
    miner = matcher_for(cfg, "miner", values)
    other = matcher_for(cfg, "other", values)
    assert miner is not None and other is not None
    assert miner(0, ["/bin/bash", "/opt/prog.sh", "--role", "miner"])
    assert not miner(0, ["/bin/bash", "/opt/prog.sh", "--role", "prover"])
    assert other(0, ["/opt/other", "--changed-flags"])  # an unshared file: the path decides


# ---------------------------------------------------------------- the RESULT line

def test_result_line_splits_on_spaces_with_dashes_for_unknowns() -> None:
    status = {
        "ts": "2026-12-02T10:00:00Z", "agent": {"uptime_s": 601.4},
        "programs": {"node": {"pid": 42, "uptime_s": 12.0, "degraded": False},
                     "miner": {"degraded": True}},
        "node": {"sha16": "0123456789abcdef", "rpc": None},
        "miner": {"hashrate": None}, "prover": {"state": None},
        "admission": {"admitted": False, "reason": "driver 570.1 is not the admitted 580.95.05"},
        "p2p": {"mapped": False},
    }
    line = result_line(status)
    words = line.split()
    assert words[:2] == ["RESULT", "standing"] and shlex.split(line) == words
    fields = dict(w.split("=", 1) for w in words[2:])
    assert fields["node_pid"] == "42" and fields["node_bin"] == "0123456789abcdef"
    assert fields["blocks"] == "-" and fields["p2p"] == "none"
    assert fields["admission"] == "refused"
    assert fields["admission_reason"] == "driver_570.1_is_not_the_admitted_580.95.05"
    assert fields["degraded"] == "miner"


def test_every_program_but_the_node_needs_a_gpu_unless_told(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'root = "{tmp_path}"\nadmitted_driver = "580.95.05"\n'
                   '[programs.node]\ncommand = ["/bin/true"]\n'
                   '[programs.watcher]\ncommand = ["/bin/true"]\n'
                   '[programs.helper]\ncommand = ["/bin/true"]\nneeds_gpu = false\n')
    programs = load_config(cfg).programs
    assert {n: p.needs_gpu for n, p in programs.items()} == {
        "node": False, "watcher": True, "helper": False}
