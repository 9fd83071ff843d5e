"""Small managed files on a fleet box (agent.toml, boot.sh, peers.txt, start hooks), and the
box's SSH host keys kept under the fleet's root."""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, OperationError, StringCommand, operation
from pyinfra.api.command import QuoteString

from agent.contract import HOST_KEYS, ROOT, SSH_DIR
from facts.box import HostKeys
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


@operation()
def host_keys_kept(root: str = ROOT):
    """
    Keep a copy of the box's SSH host keys (private and public, modes kept) in
    ``<root>/ssh-host-keys``: where the fleet's root outlives the container disk (RunPod's
    volume), the start command puts them back into /etc/ssh before sshd starts, so a
    restarted box serves the key the fleet pinned. Copies of keys gone from /etc/ssh go too.

    + root: the fleet's directory on the box

    **Example:**

    .. code:: python

        box.host_keys_kept(name="SSH host keys kept")
    """
    keys = host.get_fact(HostKeys, root=root)
    if not keys["etc"]:
        raise OperationError(f"{SSH_DIR} holds no SSH host key to keep")
    if keys["etc"] == keys["kept"]:
        host.noop("the SSH host keys are kept")
        return
    kept = f"{root}/{HOST_KEYS}"
    yield StringCommand("mkdir -p -m 700", QuoteString(kept), "&& chmod 700", QuoteString(kept))
    for name in sorted(keys["etc"]):
        if keys["kept"].get(name) != keys["etc"][name]:
            src, dst = f"{SSH_DIR}/{name}", f"{kept}/{name}"
            yield StringCommand("cp -p", QuoteString(src), QuoteString(f"{dst}.fleet-new"),
                                "&& mv -f", QuoteString(f"{dst}.fleet-new"), QuoteString(dst))
    for name in sorted(set(keys["kept"]) - set(keys["etc"])):
        yield StringCommand("rm -f", QuoteString(f"{kept}/{name}"))
