"""A stand-in for the node, miner and prover in the agent's tests (stdlib only).

Copied per role and per node release (the copies differ in VERSION, so in digest). Usage:
    <copy> ROLE [--rpc-port N] [--state FILE] [--status FILE] [--pack FILE]
                [--crash-unless FILE] [--chatty BYTES] [--orphan FILE] [--ignore-term]
                [--bad-chunks FILE] [--drip FILE]
Every start appends one JSON line to $STANDIN_LOG: the invocation record the tests count.
"""

import argparse
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

VERSION = "v1"


def record_start(role: str) -> None:
    path = os.environ.get("STANDIN_LOG")
    if path:
        line = json.dumps({"role": role, "pid": os.getpid(), "argv": sys.argv, "version": VERSION,
                           "t": time.time()})
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, (line + "\n").encode())
        os.close(fd)


def write_json(path: str, value: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def serve_node(port: int, state_file: str, bad_chunks: str = "", drip: str = "") -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            if bad_chunks and os.path.exists(bad_chunks):  # a malformed chunked answer
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(b"zz\r\n{}\r\n0\r\n\r\n")
                self.close_connection = True
                return
            status = {"version": VERSION, "blocks": 10, "daa_score": 100, "peers": 3,
                      "synced": False, "exec_tip": 5, "seed": "seed-0"}
            try:
                with open(state_file) as f:
                    status.update(json.load(f))
            except (OSError, ValueError):
                pass
            if VERSION in status.pop("unsynced_versions", []):  # a release that never syncs
                status["synced"] = False
            body = json.dumps(status).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if drip and os.path.exists(drip):  # alive, but one byte every 0.25 s
                for i in range(len(body)):
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.25)
                return
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role")
    ap.add_argument("--rpc-port", type=int, default=0)
    ap.add_argument("--state", default="")
    ap.add_argument("--status", default="")
    ap.add_argument("--pack", default="")
    ap.add_argument("--crash-unless", default="")
    ap.add_argument("--chatty", type=int, default=0)
    ap.add_argument("--orphan", default="")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--p2p", default="")
    ap.add_argument("--bad-chunks", default="")
    ap.add_argument("--drip", default="")
    args = ap.parse_args()
    record_start(args.role)
    if args.crash_unless and not os.path.exists(args.crash_unless):
        print(f"{args.role}: crashing on purpose", flush=True)
        sys.exit(3)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.rpc_port:
        serve_node(args.rpc_port, args.state, args.bad_chunks, args.drip)
    if args.orphan:
        # the shell exits at once; its background sleep is orphaned and reparented to the
        # nearest subreaper (the agent), which must reap it when it exits
        subprocess.run(["sh", "-c", f"sleep 2 & echo $! > {args.orphan}"], check=True)
    seed = ""
    if args.pack:
        try:
            with open(args.pack) as f:
                seed = f.read().strip()
        except OSError:
            seed = ""
    n = 0
    while True:
        if args.status and args.role == "miner":
            write_json(args.status, {"hashrate": 1000.0 + n, "seed": seed})
        elif args.status:
            write_json(args.status, {"state": "proving"})
        if args.chatty:
            sys.stdout.write(f"{args.role} line {n} " + "x" * args.chatty + "\n")
            sys.stdout.flush()
            time.sleep(0.02)
        else:
            time.sleep(0.5)
        n += 1


if __name__ == "__main__":
    main()
