
root=$1
cd "$root" || exit 1
exec venv/bin/python -m agent run --config "$root/agent.toml"
