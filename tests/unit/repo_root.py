"""The checkout's root, for tests that read the project's own files, wherever they sit."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
