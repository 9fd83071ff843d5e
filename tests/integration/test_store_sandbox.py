"""The sandbox's store as `fleet sandbox up` starts it with real boxes (root, openssh-server):
one HF_ENDPOINT that the operator's store client and the boxes both reach.

Run inside a network namespace of its own, so the sandbox's bridge (10.77.0.0/16) cannot meet
another test run on this machine:

    unshare --net sh -c 'ip link set lo up; .venv/bin/pytest tests/integration/test_store_*.py'
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import paramiko
import pytest
from fleet_cli import BIN, REPO, FleetCli, config, workspace

from fleet.core.boxes import Row
from fleet.state.registry import Registry
from sandbox import manage

STORE_REPO = "fleet/outputs"

# run on the operator's side with the sandbox's environment, as `fleet` itself would
PUSH = textwrap.dedent("""
    import hashlib, json, sys
    from pathlib import Path
    from fleet.providers import store
    root = Path(sys.argv[1])
    manifest = [{"path": p.relative_to(root).as_posix(), "size": p.stat().st_size,
                 "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                for p in sorted(root.rglob("*")) if p.is_file()]
    commit = store.push(sys.argv[2], root, manifest, "job/box", "outputs")
    print(json.dumps({"commit": commit, "head": store.head(sys.argv[2]),
                      "read_back": store.read_back(sys.argv[2], commit, "job/box", manifest)}))
""")

# run on a box with its own python3: the store's API and a file's bytes, by HF_ENDPOINT (the
# token comes on stdin: sshd logs the commands it runs)
ON_BOX = textwrap.dedent("""
    import hashlib, json, sys, urllib.error, urllib.request
    url, repo, path = sys.argv[1:4]
    token = sys.stdin.readline().strip()
    def get(route, auth=True):
        req = urllib.request.Request(url + route,
                                     headers={"Authorization": "Bearer " + token} if auth else {})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, b""
    status, body = get("/api/datasets/" + repo + "/revision/main")
    sha = json.loads(body)["sha"] if status == 200 else None
    got, data = get("/datasets/" + repo + "/resolve/main/" + path)
    anon, _ = get("/api/datasets/" + repo + "/revision/main", auth=False)
    print(json.dumps({"status": status, "sha": sha, "file_status": got,
                      "sha256": hashlib.sha256(data).hexdigest(), "anonymous": anon}))
""")


class Store(FleetCli):
    def rows(self) -> list[Row]:
        return Registry(self.tmp / "state" / "boxes.json").live_rows()

    def ssh(self, row: Row, command: str, stdin: str = "") -> str:
        assert row.ssh_host and row.ssh_port and row.host_key
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.get_host_keys().add(f"[{row.ssh_host}]:{row.ssh_port}", "ssh-ed25519",
                                   paramiko.Ed25519Key(data=base64.b64decode(
                                       row.host_key.split()[1])))
        client.connect(row.ssh_host, row.ssh_port, "root",
                       key_filename=str(self.tmp / "state" / "ssh" / "fleet"),
                       look_for_keys=False, allow_agent=False, timeout=15)
        try:
            into, out, err = client.exec_command(command, timeout=120)
            into.write(stdin)
            into.channel.shutdown_write()
            text = out.read().decode()
            assert out.channel.recv_exit_status() == 0, err.read().decode()
            return text
        finally:
            client.close()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    tmp, env = workspace(tmp_path_factory, "store", config, columns=200)
    sandbox_dir = tmp / "sandbox"
    s = Store(tmp, env)
    try:
        s.fleet("sandbox", "up", "--boxes", "2", "--backend", "ns")
        env.update(manage.load_env(sandbox_dir))
        yield s
    finally:
        subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                       capture_output=True, timeout=300)


def test_the_store_listens_on_the_boxes_gateway_and_nowhere_public(sandbox: Store) -> None:
    url = urlsplit(sandbox.env["HF_ENDPOINT"])
    assert url.scheme == "http" and url.hostname == "10.77.0.1"
    bridge = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", "fleetbr0"],
                            capture_output=True, text=True).stdout
    assert " 10.77.0.1/16 " in bridge
    assert sandbox.env["HF_HUB_DISABLE_XET"] == "1" and sandbox.env["HF_TOKEN"]
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{url.port}"], capture_output=True,
                               text=True).stdout
    assert [line.split()[3] for line in listening.splitlines()] == [url.netloc]


def test_operator_pushes_and_every_box_reads_the_same_commit(sandbox: Store,
                                                             tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "res").mkdir(parents=True)
    (out / "log.txt").write_text("done\n")
    (out / "res" / "b.bin").write_bytes(os.urandom((1 << 20) + 3))
    r = sandbox.run(sys.executable, "-c", PUSH, str(out), STORE_REPO)
    pushed: dict[str, Any] = json.loads(r.stdout)
    assert pushed["head"] == pushed["commit"] and pushed["read_back"] == []

    rows = sandbox.rows()
    assert {row.provider for row in rows} == {"runpod", "vast"}
    want = hashlib.sha256((out / "res" / "b.bin").read_bytes()).hexdigest()
    command = shlex.join(["python3", "-c", ON_BOX, sandbox.env["HF_ENDPOINT"], STORE_REPO,
                          "job/box/outputs/res/b.bin"])
    for row in rows:
        answer = json.loads(sandbox.ssh(row, command, stdin=sandbox.env["HF_TOKEN"] + "\n"))
        assert answer == {"status": 200, "sha": pushed["commit"], "file_status": 200,
                          "sha256": want, "anonymous": 401}, (row.label, answer)
