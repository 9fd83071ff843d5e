"""What a fleet box holds, in one round trip: `state` (for BoxState) or `node` (NodeBinary)."""

import argparse
import hashlib
import json
import os
import sys
from typing import Any


def sha(path: str) -> "str | None":
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def text(path: str) -> "str | None":
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def status(path: str) -> Any:
    try:
        return json.loads(text(path) or "null")
    except ValueError:
        return None


def alive(pidfile: str) -> bool:
    # the agent's own pid file, checked against what that pid runs (never its lock: taking
    # the lock even for a moment could make an agent starting right then refuse to run)
    try:
        with open(pidfile) as f:
            pid = int(f.read().split()[0])
        with open("/proc/" + str(pid) + "/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError, IndexError):
        return False
    return b"agent" in argv and b"run" in argv


def box_state(a: argparse.Namespace) -> "dict[str, Any]":
    return {
        "python3": sys.executable,
        "python_version": "{}.{}".format(*sys.version_info[:2]),
        "bundle": text(a.bundle),
        "venv": os.path.exists(a.venv),
        "files": {p: sha(p) for p in a.files},
        "releases": sorted(os.listdir(a.releases)) if os.path.isdir(a.releases) else [],
        "pointer": text(a.pointer),
        "pointer_sha256": text(a.pointer_sha256),
        "agent_alive": alive(a.agent_pid),
        "status": status(a.status),
    }


def node_binary(a: argparse.Namespace) -> "dict[str, Any]":
    pointer = text(a.pointer)
    s = status(a.status)
    s = s if isinstance(s, dict) else {}
    section = s.get("node") or {}  # the status's node section
    node = (s.get("programs") or {}).get(a.node) or {}
    return {
        "pointer": pointer,
        "pointer_sha256": text(a.pointer_sha256),
        "file_sha256": sha(pointer) if pointer else None,
        "running_sha16": node.get("sha16") or section.get("sha16"),
        "running_binary": node.get("binary") or section.get("binary"),
    }


def main(argv: "list[str]") -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what")
    state = sub.add_parser("state")
    for option in ("bundle", "venv", "releases", "agent-pid"):
        state.add_argument("--" + option, required=True)
    state.add_argument("files", nargs="*", help="files to digest")
    node = sub.add_parser("node")
    node.add_argument("--node", required=True, help="the node's program name")
    for p in (state, node):
        for option in ("pointer", "pointer-sha256", "status"):
            p.add_argument("--" + option, required=True)
    a = parser.parse_args(argv)
    print(json.dumps(box_state(a) if a.what == "state" else node_binary(a)))


if __name__ == "__main__":
    main(sys.argv[1:])
