"""
Convert the inventory's standing boxes into supervised standing boxes.

    pyinfra -y inventory.py deploys/standing.py          # convert (idempotent)
    pyinfra inventory.py deploys/standing.py --dry       # show what would change

Installs the agent (from shipped wheels: no package index needed on the box), writes its
agent.toml (0600), the peers file and the start hooks, keeps a copy of the box's SSH host keys
under the fleet's root (RunPod's volume: put back at a restart), places the role's release and
writes the node pointer only where the box has none, starts the agent (or keeps the running
one), and marks the registry row standing. One-shot boxes are refused.
"""

import hashlib

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import python

from agent.contract import CONFIG, PEERS, RELEASES, ROOT
from fleet.boxes import deploy_results as results
from fleet.boxes import deploy_support as support
from fleet.boxes.agent_config import render
from fleet.boxes.standing import mark_standing
from fleet.state import releases
from operations import agent, box, hook, release
from operations.util import box_state


@deploy("Standing box")
def standing() -> None:
    results.record_into(host.data.get("results_dir"))
    if host.data.get("kind") != "standing":
        results.refuse(f"{host.name} is a {host.data.get('kind')} box; only standing boxes "
                       "are converted", name="Refuse one-shot box")
        return
    role = support.config().role(host.data.role)
    shipped = support.release(role.release or "")
    rel = shipped.release
    bundle = support.agent_bundle()
    state = box_state(host, ROOT)

    toml_path, toml_text = f"{ROOT}/{CONFIG}", render(role, rel.node_sha16, host.data.card,
                                                         ROOT)

    agent.installed(name="Agent installed", bundle=str(bundle.path),
                    bundle_sha256=bundle.sha256, root=ROOT)
    agent.configured(name="agent.toml", content=toml_text, root=ROOT)
    box.file(name="Peers", path=f"{ROOT}/{PEERS}",
             content=support.inventory_mesh().text(host.name), root=ROOT)
    release.present(name=f"Release {rel.version}", tarball=str(shipped.tarball),
                    sha16=rel.node_sha16, sha256sums=shipped.sha256sums, root=ROOT)
    release.pointer(name="Node pointer",
                    node=f"{ROOT}/{RELEASES}/{rel.node_sha16}/{releases.NODE_BINARY}",
                    sha256=rel.node_sha256, root=ROOT, only_if_absent=True)
    for path, content in hook.hook_files(ROOT).items():
        box.file(name=f"Start hook {path}", path=path, content=content, mode="755", root=ROOT)
    # RunPod's start command puts these back before sshd starts (`fleet.ops.rent.ONSTART`)
    box.host_keys_kept(name="SSH host keys kept", root=ROOT)
    # a new bundle or agent.toml needs a new agent; its programs keep running and are adopted
    stale = state.get("bundle") != bundle.sha256 or state.get("files", {}).get(
        toml_path) != hashlib.sha256(toml_text.encode()).hexdigest()
    agent.running(name="Agent running", root=ROOT,
                  restart=bool(state.get("agent_alive")) and stale)
    if not host.data.get("standing"):
        python.call(name="Registry: mark standing", function=mark_standing, label=host.name,
                    role=role.name, node_sha16=rel.node_sha16)


standing()
