
root=$1
cd "$root" || exit 1
pid=$(cat run/agent.pid 2>/dev/null)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  # it leaves its programs running; give it time to finish what it was doing
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
fi
exec venv/bin/python -m agent run --config "$root/agent.toml"
