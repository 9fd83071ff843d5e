"""The labels the fleet makes, and the one form that proves a provider's box is this fleet's.

A label the fleet makes is `<role>-<fleet id>-<provider>-<6 hex>`, and a re-rent adds
`-r<n>`: `live-3fa9c1-vast-0b12ef-r2`. The fleet id is the registry's (`Registry.fleet_id`),
so a box rented by hand (`live-debug`), by another registry on the same account, or by this
fleet before it had an id, never matches: the loop may report such boxes, never destroy them.
"""

from __future__ import annotations

import re
import secrets

from fleet.core.config import PROVIDERS

MAX_LEN = 60  # what both providers take (RunPod's pod names): `providers.client.check_label`
RERENT = re.compile(r"^(?P<base>.+?)-r(?P<n>\d+)$")


def new_label(role: str, provider: str, fleet_id: str) -> str:
    return f"{role}-{fleet_id}-{provider}-{secrets.token_hex(3)}"


def rerent_label(dead: str, taken: set[str]) -> str:
    """The next free `<base>-r<n>` for the box replacing `dead` (counted from the first box)."""
    base = _base(dead)
    n = 1
    while f"{base}-r{n}" in taken:
        n += 1
    return f"{base}-r{n}"


def is_rerent_label(label: str, dead: str) -> bool:
    """Whether `label` has the form `rerent_label` gives the box replacing `dead`."""
    return re.fullmatch(rf"{re.escape(_base(dead))}-r[1-9][0-9]*", label) is not None


def _base(label: str) -> str:
    """`label` without its `-r<n>`: the first box's label."""
    m = RERENT.match(label)
    return m.group("base") if m else label


def fleet_form(roles: list[str] | tuple[str, ...] | set[str], fleet_id: str) -> re.Pattern[str]:
    """The exact form of the labels this fleet makes for `roles`."""
    names = "|".join(re.escape(r) for r in sorted(roles, key=len, reverse=True)) or "(?!)"
    providers = "|".join(PROVIDERS)
    return re.compile(rf"^(?:{names})-{re.escape(fleet_id)}-(?:{providers})-[0-9a-f]{{6}}"
                      r"(?:-r[1-9][0-9]*)?$")


def fleet_id_of(label: str) -> str | None:
    """The fleet id in `label` where it has the form every fleet makes (any role, any fleet
    id), else None: a box another registry rented on the same account is told by it."""
    m = _ANY_FLEET.match(label)
    return m.group("fleet") if m else None


_ANY_FLEET = re.compile(rf"^[a-z0-9][a-z0-9-]*?-(?P<fleet>[0-9a-f]{{6}})-(?:{'|'.join(PROVIDERS)})"
                        r"-[0-9a-f]{6}(?:-r[1-9][0-9]*)?$")


def role_prefixed(label: str, roles: list[str] | tuple[str, ...] | set[str]) -> bool:
    """Whether `label` starts like a label of one of `roles` (ours or not: see `fleet_form`)."""
    return any(label.startswith(f"{r}-") for r in roles)
