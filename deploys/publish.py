"""
Publish a node release to the standing boxes the inventory and ``--limit`` select: one wave.

    pyinfra -y inventory.py deploys/publish.py --data release=1.5.0
    pyinfra -y --limit box-a inventory.py deploys/publish.py --data release=1.5.0 \\
        --data stage_only=1                        # only stage (and verify) the files

Data (``--data k=v``):

- ``release``: the version (or node sha16) from the release store; required.
- ``stage_only=1``: place the release under ``releases/<sha16>/`` and verify it, nothing else.
- ``switch_only=1``: skip staging (``fleet publish`` stages every box first, in one run).
- ``stable_s`` (60), ``deadline_s`` (300): the agent's health window for the switch.
- ``allow_downgrade=label,label``: boxes that may be switched although they run a newer
  release (or one the store does not know).
- ``results_dir=DIR``: each box's result as ``DIR/<label>.json``: ``staged`` and ``switched``
  once it got through them, the failed step and its last output lines when it did not (what
  ``fleet publish`` reads; see fleet/boxes/deploy_results.py).

Staging verifies every file by sha256 on the box, a folder that is already there included, and
fails naming a file that differs. The switch goes through the agent (``python -m agent switch``):
pointer written by rename, old node stopped before the new one starts, healthy = synced for
``stable_s`` within ``deadline_s``, the previous pointer put back otherwise (the host fails).
A box that already runs the release is a no-op; one that runs a newer release is left alone.
``fleet publish`` drives this file wave by wave, canary first, and reads every box back.
"""


from pyinfra import host, inventory
from pyinfra.api import deploy
from pyinfra.operations import python

from agent.contract import RELEASES, ROOT
from fleet.boxes import deploy_results as results
from fleet.boxes import deploy_support as support
from fleet.state import releases
from operations import release


def _flag(name: str) -> bool:
    return str(host.data.get(name) or "").lower() in ("1", "true", "yes")


@deploy("Publish")
def publish() -> None:
    version = inventory.get_override_data().get("release")
    if not version:
        results.refuse("which release? pass --data release=VERSION", name="Release to publish")
        return
    if host.data.get("kind") != "standing" or not host.data.get("standing"):
        results.refuse(f"{host.name} is not a converted standing box; nothing is published "
                       "to it (select standing boxes: --limit standing)", name="Refuse box")
        return
    shipped = support.release(str(version))
    rel = shipped.release
    results_dir = host.data.get("results_dir")
    results.record_into(results_dir)
    if not _flag("switch_only"):
        release.present(name=f"Stage {rel.version}", tarball=str(shipped.tarball),
                        sha16=rel.node_sha16, sha256sums=shipped.sha256sums, root=ROOT,
                        verify=True)
        if results_dir:
            python.call(name="Staged", function=results.mark, results_dir=str(results_dir),
                        host=host.name, staged=True)
    if _flag("stage_only"):
        return
    store = releases.load(support.config().releases)
    older = [r.node_sha256 for r in store if r.key < rel.key]
    allowed = {x.strip() for x in str(host.data.get("allow_downgrade") or "").split(",")}
    release.switched(name=f"Switch to {rel.version}",
                     node=f"{ROOT}/{RELEASES}/{rel.node_sha16}/{releases.NODE_BINARY}",
                     sha256=rel.node_sha256, stable_s=int(host.data.get("stable_s") or 60),
                     deadline_s=int(host.data.get("deadline_s") or 300), root=ROOT,
                     older=older, downgrade=host.name in allowed)
    if results_dir:
        python.call(name="Switched", function=results.mark, results_dir=str(results_dir),
                    host=host.name, switched=True)


publish()
