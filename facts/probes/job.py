"""A one-shot job on the box: digests of its spec, its inputs and the store token file (never
the token), and the agent's state for it (`{"phase": "unreadable"}` when it is not JSON)."""

import argparse
import hashlib
import json
import sys
from typing import Any


def read(path: str) -> "bytes | None":
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def sha(path: str) -> "str | None":
    data = read(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def job_state(a: argparse.Namespace) -> "dict[str, Any]":
    raw = read(a.state)
    try:
        state = json.loads(raw) if raw else None
    except ValueError:
        state = {"phase": "unreadable"}
    inputs = read(a.inputs_sha256)
    return {
        "spec_sha256": sha(a.spec),
        "inputs_sha256": None if inputs is None else inputs.decode().strip(),
        "token_sha256": sha(a.token),
        "state": state,
    }


def main(argv: "list[str]") -> None:
    parser = argparse.ArgumentParser()
    for option in ("spec", "inputs-sha256", "state", "token"):
        parser.add_argument("--" + option, required=True)
    print(json.dumps(job_state(parser.parse_args(argv))))


if __name__ == "__main__":
    main(sys.argv[1:])
