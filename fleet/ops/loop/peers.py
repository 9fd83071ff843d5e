"""The peers files of a p2p network rewritten when its set of public endpoints changed."""

from __future__ import annotations

from fleet.core.times import now_iso
from fleet.ops.loop.base import LoopBase, Tick, peers_sig
from fleet.providers.sync import View
from fleet.state.loop_memory import Memory


class Peering(LoopBase):
    def _peers(self, t: Tick, mem: Memory, v: View) -> None:
        """Rewrite the peers files of a network's standing boxes (all its roles) when its set
        of public p2p endpoints changed since they were last written (a box rented, re-rented
        or gone, a mapping changed on a restart): the peers deploy on every box of the
        network that answers; the nodes re-read the file, none restarts. A failure is said
        and tried again next tick (the memory keeps the last set written)."""
        if self.peers_fn is None:
            return
        skip = set(t.dead) | set(v.unsure)
        meshes = self._by_network()
        for gone in set(mem.peers) - set(meshes):
            # a mesh no longer formed (a network dissolved, a role moved into one, all its
            # boxes gone): forgotten, so the same boxes and endpoints forming it again later
            # are written afresh, not taken for the files they had then
            mem.peers.pop(gone, None)
            mem.peers_at.pop(gone, None)
        for net, rows in sorted(meshes.items()):
            if not any(self.cfg.roles[r].p2p_port for r in self.cfg.network_roles(net)):
                continue
            sig = peers_sig(rows)
            if mem.peers.get(net) == sig:
                continue
            mesh = self._mesh_name(net)
            labels = sorted(r.label for r in rows if r.label not in skip)
            if not labels:
                continue
            failure = self.peers_fn(self.cfg, labels)
            if failure:
                self._act(t, f"peers files of {mesh}: {failure} (tried again next tick)")
                continue
            if len(labels) < len(rows):
                # a box this tick could not reach keeps an old file: written again next tick
                self._act(t, f"peers files of {mesh} rewritten on {len(labels)} of "
                             f"{len(rows)} boxes (the others again next tick)")
                continue
            mem.peers[net], mem.peers_at[net] = sig, now_iso()
            dialable = sum(1 for r in rows if r.public_ip and r.p2p_public_port)
            self._act(t, f"peers files of {mesh} rewritten on {len(labels)} boxes "
                         f"({dialable} dialable endpoints)")
