"""The on-box agent: supervises node, miner and prover on a rented GPU box.

Uses only the standard library, psutil and nvidia-ml-py (the one-shot job steps alone also
import pyelftools and huggingface_hub, in the step that needs one); never imports fleet. Entry
point: `python -m agent run|status|gpu|admit|ports|manifest|stop|job ...` (see docs/agent.md).
"""

__version__ = "0.1.0"
