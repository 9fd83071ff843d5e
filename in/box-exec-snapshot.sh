#!/bin/sh
# Exec-snapshot recipe: gets a node whose exec tip is stuck at 0 moving again.
#
# A real recipe downloads an execution-layer snapshot into the node's datadir; the node picks it
# up and its exec tip follows blocks again. In the sandbox the "download" is a small file,
# DATADIR/exec.snapshot, which igneumd applies (and removes) within a second.
#
# Usage: box-exec-snapshot.sh [DATADIR]   (default: $IGNEUM_DATADIR, else /root/fleet/node)
# Prints one line of outcome; exits 0 when the snapshot is in place, 1 otherwise.
set -u
datadir="${1:-${IGNEUM_DATADIR:-/root/fleet/node}}"
if [ ! -d "$datadir" ]; then
    echo "exec-snapshot: failed: no node datadir at $datadir"
    exit 1
fi
tmp="$datadir/.exec.snapshot.$$"
if ! printf 'exec-snapshot %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" > "$tmp" 2>/dev/null \
    || ! mv -f "$tmp" "$datadir/exec.snapshot"; then
    rm -f "$tmp"
    echo "exec-snapshot: failed: cannot write $datadir/exec.snapshot"
    exit 1
fi
echo "exec-snapshot: ok: snapshot placed in $datadir; the node applies it within a second"
