"""An applied pointer is held against what runs: the same pointer written again after another
release was adopted meanwhile (the deploy's `only_if_absent` on a box whose pointer had gone)
switches back to the pointer's release, never reads "applied" over the adopted one."""

from __future__ import annotations

import os
import subprocess

from agentbox import Box, node_sha16, start_with, wait_for


def test_a_pointer_rewritten_after_an_adoption_runs_its_release_again(box: Box) -> None:
    path1, sha1 = start_with(box, "v1", programs=("node",))
    path2, sha2 = box.release("v2")
    box.kill_agent(box.agents[-1])
    (box.root / "standing.node").unlink()
    (box.root / "standing.node.sha256").unlink()
    for p in box.running("node"):
        p.kill()
        p.wait()
    subprocess.Popen([str(path2), "node", "--rpc-port", str(box.rpc_port)],
                     env=dict(os.environ, STANDIN_LOG=str(box.invocations_log)),
                     start_new_session=True)  # someone starts a newer node by hand
    wait_for(lambda: box.running("node"), "the hand-started node")
    box.start_agent()
    wait_for(lambda: box.status()["node"]["source"] == "adopted"
             and node_sha16(box) == sha2[:16], "the newer node adopted")
    box.point(path1, sha1)  # the very pointer the agent applied before
    wait_for(lambda: node_sha16(box) == sha1[:16], "the pointer's release running again", 20)
    assert box.status()["node"]["source"] == "pointer"
    assert box.status()["node"]["pointer"]["state"] == "applied"
    wait_for(lambda: [p for p in box.running("node")] and all(
        str(path1) in " ".join(p.cmdline()) for p in box.running("node")), "only v1 runs")
