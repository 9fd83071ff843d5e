"""Where the project's own files are: the checkout that holds `deploys/`, `inventory.py`,
`agent/` and `in/`, which pyinfra runs from and the agent bundle is packed from."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
