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
from operations import box
from operations.util import box_state

STAMP = f"{AGENT_CODE}/{BUNDLE_STAMP}"  # the installed bundle's digest

# Unpack the bundle and make the agent's environment without pip or a package index: a bare
# venv whose site-packages receives the wheels' contents (the wheels are plain zips) and a .pth
# naming the fleet root, so `venv/bin/python -m agent` finds the agent's code. The bundle
# holds agent/, wheels/ and in/ (fleet's bundle builder). The code is compiled here, once, and
# the .pth turns bytecode writing off for every run of the venv's python after (the agent, its
# boot script, every command the fleet sends): no command, a read-only review included, writes
# outside the agent's state and logs.
_INSTALL = rf"""
set -e
root=$1 tarball=$2 sha=$3
mkdir -p "$root"
rm -rf "$root/.unpack" && mkdir "$root/.unpack"
tar -xzf "$tarball" -C "$root/.unpack"
if [ ! -x "$root/{VENV_PYTHON}" ]; then
  python3 -m venv --without-pip "$root/{VENV}" ||
    {{ echo "python3 -m venv failed on this box" >&2; exit 1; }}
fi
"$root/{VENV_PYTHON}" - "$root" "$root"/.unpack/wheels/*.whl <<'PY'
import compileall, os, sys, sysconfig, zipfile
site = sysconfig.get_paths()["purelib"]
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(site)
with open(os.path.join(site, "fleet-agent.pth"), "w") as f:
    f.write(sys.argv[1] + "\n")
    f.write("import sys; sys.dont_write_bytecode = True\n")
compileall.compile_dir(site, quiet=2)
PY
mkdir -p "$root/{INBOX}"
cp -a "$root"/.unpack/in/. "$root/{INBOX}/" 2>/dev/null || true
rm -rf "$root/{AGENT_CODE}.old"
[ -d "$root/{AGENT_CODE}" ] && mv "$root/{AGENT_CODE}" "$root/{AGENT_CODE}.old"
mv "$root/.unpack/agent" "$root/{AGENT_CODE}"
"$root/{VENV_PYTHON}" -m compileall -q "$root/{AGENT_CODE}" >/dev/null
echo "$sha" > "$root/{STAMP}.tmp" && mv "$root/{STAMP}.tmp" "$root/{STAMP}"
rm -rf "$root/.unpack" "$root/{AGENT_CODE}.old" "$tarball"
"""

# Start the agent unless it already holds its lock; it detaches itself and outlives SSH.
_START = rf"""
root=$1
cd "$root" || exit 1
exec {VENV_PYTHON} -m agent run --config "$root/{CONFIG}"
"""

# Replace a running agent without touching its programs: the new one adopts them.
_RESTART = rf"""
root=$1
cd "$root" || exit 1
pid=$(cat {AGENT_PID} 2>/dev/null)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  # it leaves its programs running; give it time to finish what it was doing
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
exec {VENV_PYTHON} -m agent run --config "$root/{CONFIG}"
"""


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
