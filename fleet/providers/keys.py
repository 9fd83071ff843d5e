"""Where the API keys come from: the environment first, then the providers' own key files.

RunPod's CLI keeps `[default] api_key = "..."` in ~/.runpod/config.toml; the vastai CLI reads
$XDG_CONFIG_HOME/vastai/vast_api_key (default ~/.config), then the legacy ~/.vast_api_key.
A key is returned wrapped in `Secret` so it cannot leak through a repr.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from fleet.core.config import KEY_ENV
from fleet.core.errors import AuthFailed
from fleet.providers.http import Secret


def key_files(provider: str) -> list[Path]:
    """The provider CLI's key files, in the order its own CLI reads them."""
    home = Path.home()
    if provider == "runpod":
        return [home / ".runpod" / "config.toml"]
    if provider == "vast":
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
        return [Path(xdg) / "vastai" / "vast_api_key", home / ".vast_api_key"]
    raise ValueError(f"unknown provider {provider!r}")


def _read(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    if path.suffix == ".toml":
        try:
            value = tomllib.loads(text).get("default", {}).get("api_key")
        except tomllib.TOMLDecodeError:
            return None  # the message would quote the file, key included
        return value.strip() if isinstance(value, str) else None
    return text.strip() or None


def resolve_key(provider: str) -> Secret:
    """The key for `provider` ("runpod" | "vast"), or AuthFailed naming where to put one."""
    env = KEY_ENV[provider]
    value = os.environ.get(env, "").strip()
    if value:
        return Secret(value)
    files = key_files(provider)
    for path in files:
        found = _read(path)
        if found:
            return Secret(found)
    where = " or ".join(str(p).replace(str(Path.home()), "~", 1) for p in files)
    raise AuthFailed(provider, "key", "no API key found", f"set {env} or write {where}")
