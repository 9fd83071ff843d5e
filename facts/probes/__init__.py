"""Probe programs: each runs on the box under its own python3 (stdlib only, before any agent
is installed) as `python3 -c <source> ARGS`, and prints one JSON object. They run on any python3
from 3.6 on (BoxState reports an older one than the agent needs; it must not fail on it): no
annotations evaluated at run time, nothing newer from the standard library. They never fail: what
is missing reads as null, so a fresh box reads as a fresh box, not as an error. Every path
they read comes in as an argument (from agent.contract), never spelled here."""

from __future__ import annotations

from functools import cache
from importlib.resources import files


@cache
def source(name: str) -> str:
    """The text of the probe `<name>.py`, shipped with this package."""
    return files(__package__).joinpath(f"{name}.py").read_text(encoding="utf-8")
