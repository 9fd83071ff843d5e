"""GraphQL documents with inline literals, as RunPod's own SDK sends them.

Inline literals need no schema type names (variables would); graphql-core's printer does the
string escaping, so a label or env value cannot break out of its quotes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from graphql.language import ast


class Enum(str):
    """A bare GraphQL enum value (cloudType: SECURE), printed without quotes."""


def literal(value: Any) -> str:
    # graphql-core here only: a call without arguments (the account's listing, every tick)
    # never loads it
    from graphql.language import print_ast

    return print_ast(_node(value))


def _node(v: Any) -> ast.ValueNode:
    from graphql.language import ast

    if v is None:
        return ast.NullValueNode()
    if isinstance(v, Enum):
        return ast.EnumValueNode(value=str(v))
    if isinstance(v, bool):
        return ast.BooleanValueNode(value=v)
    if isinstance(v, int):
        return ast.IntValueNode(value=str(v))
    if isinstance(v, float):
        return ast.FloatValueNode(value=repr(v))
    if isinstance(v, str):
        return ast.StringValueNode(value=v)
    if isinstance(v, list | tuple):
        return ast.ListValueNode(values=tuple(_node(x) for x in v))
    if isinstance(v, dict):
        return ast.ObjectValueNode(fields=tuple(
            ast.ObjectFieldNode(name=ast.NameNode(value=k), value=_node(x)) for k, x in v.items()
        ))
    raise TypeError(f"no GraphQL literal for {type(v).__name__}")


def operation(kind: str, field: str, args: dict[str, Any] | None, selection: str = "") -> str:
    """`kind { field(k: literal, ...) { selection } }`; kind is "query" or "mutation"."""
    arg_text = ""
    if args:
        arg_text = "(" + ", ".join(f"{k}: {literal(v)}" for k, v in args.items()) + ")"
    sel = f" {{ {selection} }}" if selection else ""
    return f"{kind} {{ {field}{arg_text}{sel} }}"
