"""`python -m agent readback`: what actually runs on this box, read from /proc, never from the
pointer or the agent's own status. A publish checks every row of its table against this.

For each program: the process (pidfile identity first, else the command line), whether it runs
a binary (`exe`: the digest of /proc/<pid>/exe, which is the very file the process maps, even
if the path was since replaced) or a script under an interpreter (`script`: the digest of the
script the process was started with). For the node also: the version and sync state its own
status RPC reports now, when it started, and whether that was after the pointer was written.
"""

from __future__ import annotations

import os
import time
from typing import Any, cast

from agent.base import procs
from agent.base.config import Config
from agent.base.files import DigestCache
from agent.base.identity import instances
from agent.base.journal import utc, utc_ms
from agent.base.persist import AgentState
from agent.base.pointer import read_pointer
from agent.contract import NODE, PROGRAMS, ReadbackDoc
from agent.daemon.probes import ProbeError, http_get_json


def process_view(cfg: Config, name: str, digests: DigestCache | None = None
                 ) -> dict[str, Any] | None:
    found = instances(cfg, name)
    if not found:
        return None
    info = found[0]
    path, digest, kind = procs.running_digest(info, (digests or DigestCache()).digest)
    return {"pid": info.pid, "exe_kind": kind, "path": path, "sha256": digest,
            "started_at": utc(time.time() - info.age_s), "started_ts": time.time() - info.age_s,
            "instances": len(found)}


def readback(cfg: Config, digests: DigestCache | None = None) -> ReadbackDoc:
    """What runs now. `digests`: a cache kept across read-backs (`agent switch` polls), so a
    file is hashed again only when it changed."""
    layout = cfg.layout
    digests = digests or DigestCache()
    out: dict[str, Any] = {name: process_view(cfg, name, digests) for name in PROGRAMS
                           if name in cfg.programs}
    node = out.get(NODE)
    if node is not None:
        node.update(version=None, synced=None, rpc_error=None)
        url = cfg.programs[NODE].status_url
        if url:
            try:
                answer = http_get_json(url)
                if isinstance(answer, dict):
                    node.update(version=answer.get("version"), synced=answer.get("synced"))
            except ProbeError as e:
                node["rpc_error"] = str(e)
    pointer = read_pointer(layout)
    out["pointer"] = None
    written = None
    if pointer is not None:
        try:
            written = max(os.stat(p).st_mtime for p in (layout.pointer, layout.pointer_digest))
        except OSError:
            written = None
        try:  # a FIFO or a device there is refused (see files.open_regular), never read
            target_sha = digests.sha256(pointer.target) if pointer.target else None
        except OSError:
            target_sha = None
        out["pointer"] = {"target": pointer.target, "sha256": pointer.digest_text or None,
                          "target_sha256": target_sha,
                          "written_at": utc(written) if written else None}
    out["started_after_pointer"] = (
        None if node is None or written is None else node["started_ts"] >= written - 0.05)
    switch = AgentState.load(layout.state).switch
    out["switch"] = {k: utc_ms(v) if k.endswith("_at") and isinstance(v, int | float) else v
                     for k, v in switch.items()} if switch else None
    for name in PROGRAMS:
        if out.get(name):
            out[name].pop("started_ts", None)
    return cast(ReadbackDoc, out)
