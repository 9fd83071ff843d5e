"""Small managed files on a fleet box (agent.toml, boot.sh, peers.txt, start hooks)."""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, OperationError, StringCommand, operation
from pyinfra.api.command import QuoteString

from agent.contract import ROOT
from operations.util import box_state, managed_files


@operation()
def file(path: str, content: str, mode: str = "644", root: str = ROOT):
    """
    Ensure a small managed file holds exactly ``content`` with ``mode``; replaced atomically.

    + path: absolute path on the box; one of the managed files (see ``operations.util``)
    + content: the file's full text
    + mode: octal mode, e.g. ``"600"`` for secrets-bearing config
    + root: the fleet's directory on the box

    **Example:**

    .. code:: python

        box.file(name="Agent config", path="/root/fleet/agent.toml", content=text, mode="600")
    """
    if path not in managed_files(root):
        raise OperationError(f"{path} is not a file the fleet manages on this box")
    state = box_state(host, root)
    want = hashlib.sha256(content.encode()).hexdigest()
    if state.get("files", {}).get(path) == want:
        host.noop(f"{path} is current")
        return
    tmp = f"{path}.fleet-new"
    parent = path.rsplit("/", 1)[0] or "/"
    yield StringCommand("mkdir -p", QuoteString(parent))
    yield FileUploadCommand(StringIO(content), tmp)
    yield StringCommand("chmod", QuoteString(mode), QuoteString(tmp), "&& mv -f",
                        QuoteString(tmp), QuoteString(path))
