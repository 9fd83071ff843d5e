"""The storage review and clean on a real sandbox box (its disk is a filesystem of the rented
size). The box is filled with old releases, a log rotated beyond the window, a pip cache, an
old pack export and an unread output.
- The review lists each and changes nothing.
- The clean frees what the review promised, skips a file changed since the review, and
  refuses a kept file a hand-edited review names. The running and previous releases and the
  unread output survive, and the node runs on.
- A box at 100 % disk still answers the review; the clean frees it, and its agent recovers
  without a restart.

The steps build on one box, so they run as one test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.core.boxes import Row
from sandbox import fleet_toml

ROSTER = (("vast", "RTX 4090", 1),)
ROOT = "/root/fleet"
PLANT = f"""set -e
cd {ROOT}
for d in prev old1 old2; do
  mkdir -p releases/$d; head -c 4194304 /dev/urandom > releases/$d/igneumd
done
printf '{{"previous": "%s", "previous_sha256": "ff", "to": "%s", "to_sha256": "ff"}}\\n' \\
  {ROOT}/releases/prev/igneumd "$(cat standing.node)" > standing.node.previous
head -c 1048576 /dev/urandom > log/agent.log.9
mkdir -p /root/.cache/pip/wheels; head -c 2097152 /dev/urandom > /root/.cache/pip/wheels/x.whl
mkdir -p pack.old; head -c 1048576 /dev/urandom > pack.old/pack.json
mkdir -p jobs/unread/outputs; head -c 1048576 /dev/urandom > jobs/unread/outputs/result.bin
printf '{{"phase": "finished"}}' > jobs/unread/state.json
"""
LISTED = (f"find {ROOT}/releases {ROOT}/pack.old {ROOT}/jobs /root/.cache/pip {ROOT}/log "
          f"{ROOT}/standing.node {ROOT}/standing.node.previous -name '*.log' -prune -o "
          "-printf '%p %s %T@\\n' | sort")
AGENT = f"cd {ROOT} && venv/bin/python -m agent"


def config(state: Path) -> str:
    # the smallest disk a role may ask: filling it to 100 % is quick whatever backs it
    role = fleet_toml.LIVE_ROLE.replace("disk_gb = 20", "disk_gb = 8")
    return fleet_toml.render(state, budget=500, loop=LOOP, roster=ROSTER, roles=role)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    yield from sandboxed(tmp_path_factory, "storage", config, boxes=1)


def status(fleet: Loopy, row: Row) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fleet.ssh(row, f"{AGENT} status"))
    return data


def review(fleet: Loopy, path: Path) -> dict[str, Any]:
    r = fleet.fleet("storage", "review", "--json")
    path.write_text(r.stdout)
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def cats(doc: dict[str, Any], label: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["boxes"][label]["categories"]}


# the box's own tree (the home with the fleet's root and the caches, the system's Python and
# configuration) but the agent's state and logs and the node's data, which change anyway
TREE = (f"find /root /usr /etc -xdev \\( -path {ROOT}/run -o -path {ROOT}/log "
        f"-o -path {ROOT}/out -o -path {ROOT}/node \\) -prune -o -printf '%p %s %T@\\n' | sort")


def test_the_review_writes_nothing_on_the_box(fleet: Loopy) -> None:
    """The first review after the conversion included: no bytecode, nothing at all."""
    [row] = fleet.settle()
    before = fleet.ssh(row, TREE)
    assert f"{ROOT}/agent/__pycache__/space.cpython" in before  # compiled at install
    fleet.fleet("storage", "review", "--json")
    after = fleet.ssh(row, TREE)
    assert after == before, "\n".join(sorted(set(after.splitlines()) ^ set(before.splitlines())))


def test_review_then_clean_frees_only_regenerable_files_and_a_full_disk_recovers(
        fleet: Loopy) -> None:
    [row] = fleet.settle()
    fleet.ssh(row, PLANT)
    running = fleet.ssh(row, f"cat {ROOT}/standing.node").strip()
    before = fleet.ssh(row, LISTED)
    node_pid = status(fleet, row)["programs"]["node"]["pid"]

    saved = fleet.tmp / "review.json"
    doc = review(fleet, saved)
    assert fleet.ssh(row, LISTED) == before  # the review changed nothing
    assert "a cleanup would free" in fleet.fleet("storage", "review").stdout
    c = cats(doc, row.label)
    old = sorted(Path(p[0]).parent.name for p in c["old releases"]["paths"])
    assert old == ["old1", "old2"]  # running, wanted and previous (prev) are kept
    assert c["releases"]["regenerable"] is False and c["releases"]["files"] >= 2
    assert [Path(p[0]).name for p in c["rotated logs"]["paths"]] == ["agent.log.9"]
    assert c["pip cache"]["files"] == 1 and c["old pack exports"]["files"] == 1
    assert c["job outputs"]["regenerable"] is False and c["job outputs"]["paths"] == []
    part = doc["boxes"][row.label]
    assert part["freeable_bytes"] >= 12 << 20
    assert part["free_after_bytes"] == part["disk"]["free_bytes"] + part["freeable_bytes"]

    # between review and clean: a file changes, and a hand edit names the running binary
    changed = f"{ROOT}/releases/old2/igneumd"
    fleet.ssh(row, f"head -c 4096 /dev/urandom >> {changed}")
    size, mtime = fleet.ssh(row, f"stat -c '%s %Y' {running}").split()
    mtime_ns = int(fleet.ssh(row, f"python3 -c 'import os; print(os.lstat(\"{running}\")"
                                  ".st_mtime_ns)'").strip())
    edited = json.loads(saved.read_text())
    for cat in edited["boxes"][row.label]["categories"]:
        if cat["name"] == "old releases":
            cat["paths"].append([running, int(size), mtime_ns, 0])
    saved.write_text(json.dumps(edited))
    r = fleet.fleet("storage", "clean", "--from", str(saved), "--json")
    done = json.loads(r.stdout)["boxes"][row.label]
    assert [x["path"] for x in done["skipped"]] == [changed]
    assert done["skipped"][0]["why"] == "changed since the review"
    assert [x["path"] for x in done["refused"]] == [running], done["refused"]
    for name in ("rotated logs", "pip cache", "old pack exports"):
        assert done["categories"][name]["freed"] == done["categories"][name]["promised"] > 0
    freed_old = done["categories"]["old releases"]["freed"]
    assert 0 < freed_old < done["categories"]["old releases"]["promised"]
    left = fleet.ssh(row, LISTED)
    for gone in ("releases/old1/", "agent.log.9", "pip/wheels/x.whl", "pack.old/pack.json"):
        assert gone not in left, gone
    for kept in (running, f"{ROOT}/releases/prev/igneumd", changed,
                 f"{ROOT}/jobs/unread/outputs/result.bin"):
        assert kept + " " in left, kept
    assert status(fleet, row)["programs"]["node"]["pid"] == node_pid  # the node ran on
    assert fleet.tick()["well"] == [row.label]

    # the disk at 100 %: the review still answers, the clean frees it, the agent recovers
    agent_pid = status(fleet, row)["agent_pid"]
    fleet.ssh(row, f"cd {ROOT} && mkdir -p releases/fill && "
                   "free=$(stat -f -c '%f %S' . | awk '{printf \"%d\", $1 * $2}') && "
                   "(fallocate -l $free releases/fill/blob || "
                   "fallocate -l $((free - 16777216)) releases/fill/blob) && "
                   "(dd if=/dev/zero of=releases/fill/top bs=64k 2>/dev/null || true)")
    # `disk` is read when asked (the status file may not be writable now)
    wait_for("the disk full", lambda: status(fleet, row)["disk"]["full"] is True,
             timeout=120, poll_s=1)
    full = review(fleet, saved)
    fill = [Path(p[0]).name for p in cats(full, row.label)["old releases"]["paths"]]
    assert "blob" in fill
    r = fleet.fleet("storage", "clean", "--from", str(saved), "--json")
    done = json.loads(r.stdout)["boxes"][row.label]
    assert done["categories"]["old releases"]["freed"] >= (1 << 30)
    def writing() -> bool:
        s = status(fleet, row)
        return bool(s["status_age_s"] < 15 + 5 and s["storage"]["ok"] is True)
    wait_for("the agent to write its status again", writing, timeout=120, poll_s=1)
    after = status(fleet, row)
    assert after["agent_pid"] == agent_pid and after["disk"]["full"] is False
    assert after["programs"]["node"]["pid"] == node_pid

