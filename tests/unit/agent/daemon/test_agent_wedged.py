"""A wedged node (its process runs, its status RPC never answers) is restarted by the agent
once it has been unhealthy for restart_unhealthy_after_s; 0 keeps it running (report only)."""

from __future__ import annotations

import hashlib
import json

from agentbox import PY, Box, wait_for

# A node that takes connections on its RPC port and never answers them: only the agent's probe
# timeout can tell it from a slow one. Every start appends a line to STANDIN_LOG.
WEDGED = '''
import json, os, signal, socket, sys, threading, time
port = int(sys.argv[sys.argv.index("--rpc-port") + 1])
fd = os.open(os.environ["STANDIN_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, (json.dumps({"role": "node", "pid": os.getpid(), "t": time.time()}) + "\\n").encode())
os.close(fd)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
held = []
def hold():
    while True:
        held.append(s.accept()[0])  # read nothing, answer nothing
threading.Thread(target=hold, daemon=True).start()
signal.pause()
'''


def wedged_node(box: Box) -> None:
    text = f"#!{PY}\n{WEDGED}"
    sha = hashlib.sha256(text.encode()).hexdigest()
    path = box.root / "releases" / sha[:16] / "node"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    box.point(path, sha)


def test_a_node_that_never_answers_is_restarted(box: Box) -> None:
    wedged_node(box)
    box.configure(programs=("node",), stable_s=0.5,
                  program_overrides={"node": {"restart_unhealthy_after_s": 1.5}})
    box.start_agent()
    first = wait_for(lambda: box.pid_of("node"), "the wedged node running")
    wait_for(lambda: box.program("node").get("healthy") is False, "the node judged unhealthy")
    second = wait_for(lambda: (pid := box.pid_of("node")) and pid != first and pid,
                      "the wedged node restarted under a new pid", timeout=60)
    assert second != first
    assert f"node: stopping pid {first} (unhealthy" in box.journal()
    # the new process writes its invocation once it runs, which may be after its pid shows
    starts = wait_for(lambda: len(got := [json.loads(ln) for ln in
                                          box.invocations_log.read_text().splitlines() if ln])
                      >= 2 and got, "the restarted node's invocation logged")
    assert [s["pid"] for s in starts][:2] == [first, second]


def test_report_only_keeps_a_wedged_node_running(box: Box) -> None:
    wedged_node(box)
    box.configure(programs=("node",), stable_s=0.5,
                  program_overrides={"node": {"restart_unhealthy_after_s": 0}})
    box.start_agent()
    first = wait_for(lambda: box.pid_of("node"), "the wedged node running")
    wait_for(lambda: box.program("node").get("healthy") is False, "the node judged unhealthy")
    # two more full probes (each waits out the RPC timeout) with the node still unhealthy
    for _ in range(2):
        at = box.status()["node"]["rpc_at"]
        wait_for(lambda at=at: box.status()["node"]["rpc_at"] != at, "another probe", 30)
    assert box.pid_of("node") == first
    assert "unhealthy" not in box.journal()
