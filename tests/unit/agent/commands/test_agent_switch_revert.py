"""`agent switch` never reverts over a newer pointer: a slow switch whose release never syncs
leaves alone a pointer someone else wrote meanwhile, and two switches never interleave."""

from __future__ import annotations

import json
import subprocess
import time

from agentbox import PY, Box, wait_for


def switch_cmd(box: Box, path: str, sha: str, deadline_s: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "agent", "switch", "--node", path, "--sha256", sha,
                             "--stable-s", "0.5", "--deadline-s", deadline_s,
                             "--config", str(box.config_path)],
                            env=box.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _v1_answering(box: Box) -> None:
    """The agent up on v1; v3 is a release that never syncs (a switch to it gives up)."""
    box.set_node_state(synced=True, blocks=1500, exec_tip=1400, unsynced_versions=["v3"])
    path1, sha1 = box.release("v1")
    box.point(path1, sha1)
    box.configure()
    box.start_agent()
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("version") == "v1", "v1 answering")


def test_a_revert_never_overwrites_a_pointer_written_meanwhile(box: Box) -> None:
    _v1_answering(box)
    path3, sha3 = box.release("v3")  # never syncs: this switch will give up at its deadline
    path2, sha2 = box.release("v2")
    slow = switch_cmd(box, str(path3), sha3, "4")
    wait_for(lambda: (box.root / "standing.node").read_text().strip() == str(path3),
             "the slow switch pointed at v3")
    box.point(path2, sha2)  # a newer publish (by hand, or a deploy) meanwhile
    out, err = slow.communicate(timeout=60)
    result = json.loads(out)
    assert result["outcome"] == "superseded" and slow.returncode == 5, (result, err)
    assert str(path2) in result["reason"]
    assert (box.root / "standing.node").read_text().strip() == str(path2)
    assert (box.root / "standing.node.sha256").read_text().split()[0] == sha2
    wait_for(lambda: box.program("node").get("sha16") == sha2[:16], "v2 runs, not v1")


def test_two_switches_never_interleave(box: Box) -> None:
    _v1_answering(box)
    path3, sha3 = box.release("v3")
    path2, sha2 = box.release("v2")
    first = switch_cmd(box, str(path3), sha3, "3")
    wait_for(lambda: (box.root / "standing.node").read_text().strip() == str(path3),
             "the first switch pointed at v3")
    second = switch_cmd(box, str(path2), sha2, "20")
    time.sleep(0.5)
    assert (box.root / "standing.node").read_text().strip() == str(path3)  # it waits its turn
    first_out = json.loads(first.communicate(timeout=60)[0])
    assert first_out["outcome"] == "reverted", first_out
    second_out = json.loads(second.communicate(timeout=60)[0])
    assert second_out["outcome"] == "switched", second_out
    assert (box.root / "standing.node").read_text().strip() == str(path2)
