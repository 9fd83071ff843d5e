"""
Operations for the on-box agent: its code and Python environment, its configuration, and the
process itself. Each reads the box's state once (`BoxState`) and yields only what is missing.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FileUploadCommand, OperationError, StringCommand, operation
from pyinfra.api.command import QuoteString

from agent.contract import (
    AGENT_CODE,
    AGENT_PID,
    BUNDLE_STAMP,
    CONFIG,
    INBOX,
    ROOT,
    VENV,
    VENV_PYTHON,
)
from operations import box, script
from operations.util import box_state

STAMP = f"{AGENT_CODE}/{BUNDLE_STAMP}"  # the installed bundle's digest

# the shell programs (scripts/agent_*.sh.j2), with the contract's names in place
_NAMES = {"AGENT_CODE": AGENT_CODE, "AGENT_PID": AGENT_PID, "CONFIG": CONFIG, "INBOX": INBOX,
          "STAMP": STAMP, "VENV": VENV, "VENV_PYTHON": VENV_PYTHON}
_INSTALL = script.render("agent_install", **_NAMES)  # unpack the bundle, make the venv
_START = script.render("agent_start", **_NAMES)  # start the agent unless it holds its lock
_RESTART = script.render("agent_restart", **_NAMES)  # replace it; its programs are adopted


def _need_python(state: dict[str, object]) -> None:
    if state.get("python3") is None:
        raise OperationError(
            "this box has no python3: the agent needs Python 3.11 or newer in the image")
    major, _, minor = str(state.get("python_version") or "0.0").partition(".")
    if (int(major), int(minor or 0)) < (3, 11):
        raise OperationError(f"this box's python3 is {state.get('python_version')}: the agent "
                             "needs Python 3.11 or newer in the image")


@operation()
def installed(bundle: str, bundle_sha256: str, root: str = ROOT):
    """
    Install the agent bundle (code, wheels, ``in/`` scripts) and its Python environment.

    + bundle: local path of the bundle built by ``fleet.boxes.bundle.build``
    + bundle_sha256: the bundle's digest; the box's stamp is compared with it
    + root: the fleet's directory on the box

    **Example:**

    .. code:: python

        agent.installed(name="Install the agent", bundle=b.path, bundle_sha256=b.sha256)
    """
    state = box_state(host, root)
    _need_python(state)
    if state.get("bundle") == bundle_sha256 and state.get("venv"):
        host.noop(f"agent bundle {bundle_sha256[:16]} is installed")
        return
    tarball = f"/tmp/fleet-agent-{bundle_sha256[:16]}.tar.gz"
    yield FileUploadCommand(bundle, tarball)
    yield StringCommand("sh -c", QuoteString(_INSTALL), "install", QuoteString(root),
                        QuoteString(tarball), QuoteString(bundle_sha256))


@operation()
def configured(content: str, root: str = ROOT):
    """
    Write the agent's configuration, ``<root>/agent.toml``, mode 0600, when it differs.

    + content: the full agent.toml text (``fleet.boxes.agent_config.render``)
    + root: the fleet's directory on the box

    **Example:**

    .. code:: python

        agent.configured(name="Agent config", content=render(role, sha16))
    """
    yield from box.file._inner(path=f"{root}/{CONFIG}", content=content, mode="600", root=root)


@operation()
def running(root: str = ROOT, restart: bool = False):
    """
    Keep the agent running: start it when it is not, replace it when ``restart`` is set (new
    code or configuration). Its programs keep running either way; the new agent adopts them.

    + root: the fleet's directory on the box
    + restart: replace a running agent (used when the bundle or agent.toml changed)
    """
    state = box_state(host, root)
    alive = bool(state.get("agent_alive"))
    if alive and not restart:
        host.noop("agent is running")
        return
    script = _RESTART if alive else _START
    yield StringCommand("sh -c", QuoteString(script), "agent", QuoteString(root))
