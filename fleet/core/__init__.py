"""The shared vocabulary: errors, fleet.toml, job files, card names, labels, times, box rows and
verdicts. Imports nothing of fleet above it (only `agent.contract` from the agent)."""
