"""The agent's foundations: files, processes, NVML, the pointer, the config, the one way to stop
a process. Imports nothing of the agent above it (only agent.contract)."""
