"""Each host's result of a pyinfra run, as JSON the operator's side reads: `<dir>/<host>.json`.

A deploy file calls `record_into(dir)`; the run's process then writes, for each host whose
operation failed, which operation and the last lines it printed (`{"errors": [{"step",
"stdout", "stderr"}]}`), beside whatever the deploy itself marks there (publish's `staged`). pyinfra
completes an operation's output only after its error callback, so the errors are written when
the process ends. `read(dir)` is the other side (`fleet.boxes.pyinfra_run.run_pyinfra`): what
`fleet converge`, the loop, `fleet publish` and `fleet run` say about a box, never words
picked out of pyinfra's printed output."""

from __future__ import annotations

import atexit
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet.core.fileutil import write_atomic

OUTPUT_LINES = 40  # of each of a failed operation's outputs (stdout, stderr), kept per error

_failed: list[tuple[Any, Any, str]] = []  # (state, host, op_hash)
_into: list[Path] = []


def record_into(results_dir: str | None) -> None:
    """Write this run's per-host errors into `results_dir` (once per process; none without)."""
    if not results_dir or _into:
        return
    # pyinfra here only, in the deploy's own process: the operator's side reads the results
    # (`read`) without loading it
    from pyinfra import state
    from pyinfra.api.state import BaseStateCallback

    class _Recorder(BaseStateCallback):
        @staticmethod
        def operation_host_error(state: Any, host: Any, op_hash: str, retry_count: int = 0,
                                 max_retries: int = 0) -> None:
            _failed.append((state, host, op_hash))

    _into.append(Path(results_dir))
    state.add_callback_handler(_Recorder())
    atexit.register(_write)


def refuse(message: str, name: str) -> None:
    """Fail this host's deploy here with `message` (pyinfra's `python.raise_exception` of a
    ValueError, the operation named `name`); the deploy returns after it."""
    from pyinfra.operations import python

    # pyinfra's typing of an operation's call reads the first positional arguments as its
    # global ones (`_sudo`, ...); the operation itself takes the exception and its message
    raise_exception: Callable[..., object] = python.raise_exception
    raise_exception(ValueError, message, name=name)


def mark(results_dir: str | Path, host: str, **fields: Any) -> None:
    """Merge `fields` into the host's results."""
    path = Path(results_dir) / f"{host}.json"
    write_atomic(path, json.dumps({**_load(path), **fields}) + "\n")


def _write() -> None:
    for state, host, op_hash in _failed:
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        done_op = meta.is_complete()
        step = ", ".join(state.get_op_meta(op_hash).names) or "an operation"
        path = _into[0] / f"{host.name}.json"
        done = _load(path)
        errors = [*done.get("errors", []), {
            "step": step,
            "stdout": meta.stdout_lines[-OUTPUT_LINES:] if done_op else [],
            "stderr": meta.stderr_lines[-OUTPUT_LINES:] if done_op else []}]
        mark(_into[0], host.name, errors=errors)


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read(results_dir: Path) -> dict[str, dict[str, Any]]:
    """Every host's results in `results_dir`, by host name."""
    return {p.stem: _load(p) for p in sorted(results_dir.glob("*.json"))}
