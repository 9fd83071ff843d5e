"""`python -m agent manifest DIR`: path, size and sha256 of every regular file under DIR."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent.errors import usage_error
from agent.files import sha256_file


def manifest(root: Path) -> list[dict[str, Any]]:
    if not root.is_dir():
        raise usage_error(f"{root} is not a directory")
    entries: list[dict[str, Any]] = []
    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into symlinked dirs
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            entries.append({
                "path": path.relative_to(root).as_posix(),
                "size": path.stat().st_size,
                "sha256": sha256_file(path),
            })
    entries.sort(key=lambda e: str(e["path"]))
    return entries
