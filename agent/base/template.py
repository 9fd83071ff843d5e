"""Command templates: placeholders such as {node_bin} or {p2p_public_port} filled per start.

A value may be unknown (no p2p mapping on this box): an argument or environment value that
names an unknown placeholder is left out, rather than passed half-filled, and so is the option
that introduces it (`--p2p-public {p2p_public_ip}:{p2p_public_port}` disappears whole).

`check` refuses at config load what would fail at a start: a placeholder inside another's
format spec (`{name:{p2p_public_port}}`, whose value may be unknown only at run time), a width
or precision that no argument can hold, and a rendered text longer than an argument may be.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence

Values = Mapping[str, str | None]

# the kernel's MAX_ARG_STRLEN (32 pages): an argument or NAME=value longer fails the exec
MAX_ARG_BYTES = 128 * 1024 - 1
# what a command line and its own environment may take together, of the kernel's ARG_MAX (a
# quarter of the stack limit, 2 MiB at the usual 8 MiB), leaving the rest to the inherited
# environment and the pointers
MAX_ARGV_TOTAL_BYTES = 1024 * 1024
# at load the sample values are short; a real value (a path) may be up to PATH_MAX longer
LOAD_MARGIN_BYTES = 8 * 1024
_NUMBER = re.compile(r"\d+")


class TemplateError(ValueError):
    pass


def _parsed(text: str) -> list[tuple[str, str, str | None]]:
    """(field, format spec, conversion) of each placeholder; TemplateError for a nested one."""
    try:
        parts = [(f, spec or "", conv) for _, f, spec, conv in string.Formatter().parse(text)
                 if f is not None]
    except ValueError as e:
        raise TemplateError(str(e)) from None
    for field, spec, _ in parts:
        if "{" in spec or "}" in spec:
            raise TemplateError(f"a placeholder inside the format spec of {{{field}}} (nested)")
    return parts


def fields_of(text: str) -> list[str]:
    return [f for f, _, _ in _parsed(text)]


def check(text: str, allowed: frozenset[str]) -> None:
    """Refuse (TemplateError, or KeyError naming an unknown placeholder) a template that
    could fail or overflow when rendered with any values of the allowed placeholders."""
    limit = MAX_ARG_BYTES - LOAD_MARGIN_BYTES
    for field, spec, _ in _parsed(text):
        if field not in allowed:
            raise KeyError(field)
        if any(int(n) > limit for n in _NUMBER.findall(spec)):
            raise TemplateError(f"a width or precision over {limit} in {{{field}:{spec}}}")
    try:  # every value may be a string: a conversion or spec str.format refuses fails here
        rendered = text.format_map(dict.fromkeys(allowed, "sample"))
    except Exception as e:  # whatever format raises is a refusal, never a traceback
        raise TemplateError(f"{type(e).__name__}: {e}") from None
    if len(rendered.encode()) > limit:
        raise TemplateError(f"renders to {len(rendered.encode())} bytes, over the {limit} "
                            "an argument may take")


def check_total(argv: Sequence[str], env: Mapping[str, str], allowed: frozenset[str]) -> None:
    """Refuse (TemplateError) a command whose arguments and environment, each within the
    argument limit (check), come to more together than an exec can take."""
    sample = dict.fromkeys(allowed, "sample")
    total = sum(len(a.format_map(sample).encode()) + 1 for a in argv)
    total += sum(len(f"{k}={v.format_map(sample)}".encode()) + 1 for k, v in env.items())
    limit = MAX_ARGV_TOTAL_BYTES - LOAD_MARGIN_BYTES * (len(argv) + len(env))
    if total > limit:
        raise TemplateError(f"the command and its environment render to {total} bytes "
                            f"together, over the {limit} an exec may take")


def render_text(text: str, values: Values) -> str | None:
    """text with placeholders filled, or None when one of them has no value. TemplateError
    when the result is longer than an argument may be."""
    if any(values.get(name) is None for name in fields_of(text)):
        return None
    rendered = text.format_map({k: v for k, v in values.items() if v is not None})
    if len(rendered.encode()) > MAX_ARG_BYTES:
        raise TemplateError(f"{text[:40]!r} renders to {len(rendered.encode())} bytes, over "
                            f"the {MAX_ARG_BYTES} an argument may take")
    return rendered


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
