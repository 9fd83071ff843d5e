"""Command templates: placeholders such as {node_bin} or {p2p_public_port} filled per start.

A value may be unknown (no p2p mapping on this box): an argument or environment value that
names an unknown placeholder is left out, rather than passed half-filled, and so is the option
that introduces it (`--p2p-public {p2p_public_ip}:{p2p_public_port}` disappears whole).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence

Values = Mapping[str, str | None]


def fields_of(text: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]


def render_text(text: str, values: Values) -> str | None:
    """text with placeholders filled, or None when one of them has no value."""
    if any(values.get(name) is None for name in fields_of(text)):
        return None
    return text.format_map({k: v for k, v in values.items() if v is not None})


def render_argv(template: Sequence[str], values: Values) -> list[str]:
    """The filled argument list. An argument naming a placeholder without a value is left out,
    and so is the option just before it when that option takes it as its value (`--flag`
    followed by the argument, as opposed to `--flag=...` or a placeholder-free argument)."""
    argv: list[str] = []
    for i, arg in enumerate(template):
        rendered = render_text(arg, values)
        if rendered is not None:
            argv.append(rendered)
            continue
        before = template[i - 1] if i > 0 else ""
        if argv and before.startswith("-") and "=" not in before and not fields_of(before):
            argv.pop()
    return argv


def render_env(env: Mapping[str, str], values: Values) -> dict[str, str]:
    out = {}
    for key, text in env.items():
        rendered = render_text(text, values)
        if rendered is not None:
            out[key] = rendered
    return out
