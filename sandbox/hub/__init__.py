"""A Hub-compatible store for the sandbox: what huggingface_hub needs to push and read back.

`HubServer(root, token, host, port)` serves repositories (datasets, models, spaces) from `root`
over the routes the real client calls (see `sandbox.hub.routes` and docs/sandbox.md), with
faults armed through `HubServer.faults` or `POST /_sandbox/faults`.
"""

from sandbox.hub.client_env import client_env
from sandbox.hub.faults import FAULT_KINDS, HubFaults
from sandbox.hub.server import HubServer
from sandbox.hub.store import HubError, HubStore

__all__ = ["FAULT_KINDS", "HubError", "HubFaults", "HubServer", "HubStore", "client_env"]
