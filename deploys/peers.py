"""
Rewrite the peers file of the inventory's standing boxes, and nothing else.

    pyinfra -y inventory.py deploys/peers.py            # idempotent: an unchanged set is no change
    pyinfra inventory.py deploys/peers.py --dry         # show which boxes' files would change

Each box's peers file lists the public p2p endpoints (its provider's mapping of the p2p port)
of the other standing boxes of its network, whatever their role (a role in no `[networks]` table
is a network of its own), as the standing deploy writes it. `fleet loop` runs this deploy
whenever a network's set changes (a box rented, re-rented or gone, a mapping that changed on a
restart). The node re-reads the file every second, so no node is restarted for it.
"""

from pyinfra import host
from pyinfra.api import deploy

from agent.contract import PEERS, ROOT
from fleet.boxes import deploy_results as results
from fleet.boxes import deploy_support as support
from operations import box


@deploy("Peers file")
def peers() -> None:
    results.record_into(host.data.get("results_dir"))
    if host.data.get("kind") != "standing":
        return  # a one-shot box runs no node
    box.file(name="Peers", path=f"{ROOT}/{PEERS}",
             content=support.inventory_mesh().text(host.name), root=ROOT)


peers()
