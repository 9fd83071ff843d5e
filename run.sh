#!/usr/bin/env bash
# One entry point for a fresh machine: `./run.sh demo` (the sandbox demo) and `./run.sh test`.
# Both install what they need first: Debian packages (sshd for the sandbox boxes, iproute2 for
# their namespaces, gcc for the stand-in NVML, Debian's python3 for the boxes, postgresql for the
# tests' database servers) and the project's Python environment in .venv. The tests start servers
# of their own (tests/pgserver.py: own socket folder, no TCP), so a default cluster the package
# may start meets none of them, and none needs a running systemd.
set -euo pipefail
cd "$(dirname "$0")"

DEBIAN_PACKAGES=(openssh-server openssh-client iproute2 gcc libc6-dev python3 python3-venv
                 procps psmisc util-linux mount e2fsprogs chromium postgresql)

setup() {
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        missing=()
        for p in "${DEBIAN_PACKAGES[@]}"; do
            dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
        done
        if [ ${#missing[@]} -gt 0 ]; then
            echo "installing Debian packages: ${missing[*]}"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq >/dev/null || true
            apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
        fi
    fi
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    if ! .venv/bin/python -c "import fleet, pyinfra, pytest" 2>/dev/null \
        || [ pyproject.toml -nt .venv/.installed ] || [ constraints.txt -nt .venv/.installed ]; then
        .venv/bin/python -m pip install -q --upgrade pip >/dev/null
        .venv/bin/python -m pip install -q -c constraints.txt -e '.[test]'
        touch .venv/.installed
    fi
}

# The whole suite. The tests, the simulation and the integration modules run on WORKERS
# pytest-xdist workers, a whole module to each (`--dist loadfile`: a module's sandbox is its
# own), the longest modules first (tests/conftest.py); each worker is in a network namespace of
# its own (tests/lane-python), so their sandboxes take the same bridge and subnet apart. Every
# benchmark's smoke run (tests/bench) goes beside them, in one more namespace and one process
# (they compare bench/out before and after). The tests mostly wait on boxes, so WORKERS is
# more than the cores. A namespace has no route out: the agent's wheels are fetched first.
WORKERS=4

suite() {
    .venv/bin/python -c 'from fleet.boxes.bundle import fetch_wheels; fetch_wheels()'
    local log status=0 bench_status=0
    log="$(mktemp -t fleet-bench-smoke.XXXXXX)"
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/pytest -q -p no:cacheprovider tests/bench' \
        >"$log" 2>&1 &
    local bench=$!
    .venv/bin/pytest -q --tx "$WORKERS*popen//python=$PWD/tests/lane-python" --dist loadfile \
        --no-loadscope-reorder tests/integration tests/unit tests/sim || status=$?
    # the unit tests again with the state in PostgreSQL: a real server per worker, each test a
    # schema of its own (tests/pgserver.py)
    FLEET_TEST_BACKEND=postgresql .venv/bin/pytest -q \
        --tx "$WORKERS*popen//python=$PWD/tests/lane-python" --dist loadfile tests/unit \
        || status=$?
    # pyinfra-testing monkeypatches with gevent on import: its own process
    .venv/bin/pytest -q -p no:cacheprovider tests/pyinfra || status=$?
    wait "$bench" || bench_status=$?
    echo "--- the benchmarks' smoke runs (tests/bench) ---"
    cat "$log"
    rm -f "$log"
    [ "$status" = 0 ] && [ "$bench_status" = 0 ]
}

case "${1:-}" in
    setup)
        setup ;;
    test)
        shift
        setup
        if [ -f .sandbox/daemon.json ]; then
            # the integration tests build sandboxes on the same network as the demo's
            echo "stopping the demo's sandbox first (fleet sandbox down)"
            .venv/bin/fleet sandbox down || true
        fi
        .venv/bin/ruff check .
        .venv/bin/mypy fleet agent sandbox facts operations lowio deploys inventory.py
        .venv/bin/mypy --strict fleet/core fleet/state agent/contract.py  # the vocabulary
        .venv/bin/lint-imports --no-cache  # the layers (pyproject.toml [tool.importlinter])
        if [ $# -gt 0 ]; then
            exec .venv/bin/pytest -q "$@"  # just what was asked for
        fi
        suite ;;
    demo)
        shift
        setup
        exec .venv/bin/python -m fleet.demo "$@" ;;
    *)
        echo "usage: ./run.sh demo | test [pytest args] | setup" >&2
        exit 2 ;;
esac
