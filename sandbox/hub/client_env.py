"""The environment that points huggingface_hub (and fleet's store) at a sandbox Hub server."""

from __future__ import annotations


def client_env(url: str, token: str) -> dict[str, str]:
    """HF_ENDPOINT and HF_TOKEN, with Xet off (the server speaks plain LFS; a client that tries
    Xet fails hard) and no telemetry (nothing to send it to)."""
    return {"HF_ENDPOINT": url, "HF_TOKEN": token, "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1"}
