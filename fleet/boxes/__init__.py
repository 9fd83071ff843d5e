"""The one way to reach a box: SSH and pinned host keys, pyinfra runs, the inventory, what a
deploy ships (the agent bundle, agent.toml)."""
