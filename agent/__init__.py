"""The on-box agent: supervises node, miner and prover on a rented GPU box.

Uses only the standard library, psutil and nvidia-ml-py; never imports fleet. Entry point:
`python -m agent run|status|gpu|admit|ports|manifest|stop` (see docs/agent.md).
"""

__version__ = "0.1.0"
