"""pyinfra inventory: the fleet's live boxes, grouped by role, kind and provider.

    pyinfra inventory.py deploys/standing.py
    pyinfra inventory.py --limit live debug-inventory

Reads fleet.toml (or $FLEET_CONFIG), the box registry and both providers' APIs (keys and URLs
from the environment). A provider that cannot be reached stops here with one line.
"""

import sys as _sys

from fleet.boxes.inventory import build as _build
from fleet.core.config import load as _load
from fleet.core.errors import FleetError as _FleetError
from fleet.providers.factory import all_providers as _all_providers

try:
    _built = _build(_load(), dict(_all_providers()))
except _FleetError as _e:
    print(f"error: inventory: {_e}", file=_sys.stderr)
    raise SystemExit(2) from None

for _b in _built.orphans:
    print(f"warning: orphan {_b.provider} box {_b.box_id} ({_b.label or 'no label'}) is not in "
          "the registry; not deploying to it", file=_sys.stderr)

globals().update(_built.groups)
