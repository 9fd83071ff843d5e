"""Sandbox boxes: each running instance of the fake providers is a real SSH host here.

`NamespaceBackend` implements `sandbox.backend.BoxBackend` with Linux namespaces, a bridge and
OpenSSH's sshd; `sweep` removes what a crashed run left; `DEBIAN_PACKAGES` lists what the host
needs. See docs/sandbox.md, "Boxes".
"""

from sandbox.boxes.backend import NamespaceBackend
from sandbox.boxes.cleanup import sweep
from sandbox.boxes.errors import BoxError
from sandbox.boxes.host import DEBIAN_PACKAGES, preflight

__all__ = ["DEBIAN_PACKAGES", "BoxError", "NamespaceBackend", "preflight", "sweep"]
