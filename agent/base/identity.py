"""How the agent recognises a program among the box's processes (for adoption, duplicates
and `stop`), when no pidfile vouches for it.

With `match` set, that regex decides. Otherwise the program file must be the exact path the
command template names (the script, for an interpreter such as python3), and for the node:
the current node binary, or any binary of the same name under {root}/releases/ (a newer
release someone started by hand). Programs sharing one program file must also have the
same arguments. These defaults are specific to this root, so two roots on one machine never
adopt each other's programs.
"""

from __future__ import annotations

import os

from agent.base import procs
from agent.base.config import Config
from agent.base.files import read_json
from agent.base.persist import AgentState
from agent.base.template import TemplateError, Values, render_argv, render_text
from agent.contract import NODE


def matcher_for(cfg: Config, name: str, values: Values) -> procs.Matcher | None:
    program = cfg.programs[name]
    if program.match:
        return procs.regex_matcher(program.match)
    releases = os.path.normpath(str(cfg.layout.releases)) + os.sep
    if name == NODE:
        current = values.get("node_bin")
        exe_name = os.path.basename(current) if current else NODE
        current_path = os.path.normpath(current) if current else None

        def node_path(path: str) -> bool:
            return path == current_path or path.startswith(releases)

        return procs.path_matcher(exe_name, node_path)
    own = _program_file(cfg, name, values)
    if own is None:
        return None
    path, args = own
    # programs sharing one program file (one script, different arguments) are told apart by
    # their arguments; otherwise the path alone decides, so changed flags still match
    shared = any(
        other != name and other != NODE and (_program_file(cfg, other, values) or ("",))[0] == path
        for other in cfg.programs
    )
    return procs.path_matcher(os.path.basename(path), lambda p: p == path,
                              args if shared else None)


def _program_file(cfg: Config, name: str, values: Values) -> tuple[str, list[str]] | None:
    """The absolute path of a program's file and the arguments after it."""
    program = cfg.programs[name]
    try:
        argv = render_argv(program.command, {**values, "name": name})
    except TemplateError:  # a command too long to run here: it is never started either
        return None
    i = procs.executable_index(argv)
    if i is None:
        return None
    exe = argv[i]
    if not os.path.isabs(exe):
        exe = os.path.join(render_text(program.cwd, values) or str(cfg.root), exe)
    return os.path.normpath(exe), argv[i + 1 :]


def instances(cfg: Config, name: str) -> list[procs.ProcInfo]:
    """From outside the agent (`stop`, `readback`): the live processes that are this program,
    the one its pidfile names first, then any other the command line identifies."""
    found: dict[int, procs.ProcInfo] = {}
    info = procs.from_record(read_json(cfg.layout.pidfile(name)))
    if info is not None:
        found[info.pid] = info
    binary = AgentState.load(cfg.layout.state).node_binary
    values: dict[str, str | None] = {
        "root": str(cfg.root), "name": name, "node_bin": binary.path if binary else None,
        "p2p_port": str(cfg.p2p_port), "p2p_public_ip": None, "p2p_public_port": None,
    }
    matches = matcher_for(cfg, name, values)
    if matches is not None:
        for other in procs.scan(matches):
            found.setdefault(other.pid, other)
    return list(found.values())
