#!/bin/sh
# written by fleet: start the agent after a container (re)start
mkdir -p /root/fleet/log && cd /root/fleet || exit 0
exec venv/bin/python -m agent run --config /root/fleet/agent.toml >>/root/fleet/log/boot.log 2>&1
