
set -e
root=$1 node=$2 sha=$3 only_if_absent=$4 wait_s=$5
mkdir -p "$root/run"
exec 9>>"$root/run/switch.lock"
if ! flock -w "$wait_s" 9; then
  echo "another switch has held run/switch.lock for $wait_s s; pointer not written" >&2
  exit 1
fi
if [ "$only_if_absent" = 1 ] && [ -e "$root/standing.node" ]; then
  echo "pointer exists; left alone"
  exit 0
fi
echo "$sha" > "$root/.standing.node.sha256.new"
echo "$node" > "$root/.standing.node.new"
mv -f "$root/.standing.node.sha256.new" "$root/standing.node.sha256"
mv -f "$root/.standing.node.new" "$root/standing.node"
