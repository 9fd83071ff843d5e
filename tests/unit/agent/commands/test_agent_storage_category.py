"""The storage rules' category of each of many paths, on a box whose rules were read (one
release kept, no recovery, no job) and on one whose rules were not (every release kept, the
snapshots and the toolchain cache in use). The expected values are the ones `category` gave
before it was split into its caches' part and its root's part."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.space import Rules

CACHES = (("pip cache", Path("/h/.cache/pip")),
          ("huggingface cache", Path("/h/.cache/huggingface")),
          ("apt cache", Path("/var/cache/apt/archives")))
READ = Rules(Path("/r"), 3, frozenset({"aaa"}), False, False, CACHES)
UNREAD = Rules(Path("/r"), 3, None, True, True, CACHES)

# path, its category under READ, under UNREAD (None: not the fleet's)
CASES: list[tuple[str, str | None, str | None]] = [
    ('/r', 'fleet files', 'fleet files'),
    ('/r/', 'fleet files', 'fleet files'),
    ('/rx', None, None),
    ('/rx/a', None, None),
    ('/', None, None),
    ('/other/a', None, None),
    ('/h/.cache/pip', None, None),
    ('/h/.cache/pip/a/b.whl', 'pip cache', 'pip cache'),
    ('/h/.cache/pipx/a', None, None),
    ('/h/.cache/huggingface', None, None),
    ('/h/.cache/huggingface/hub/x', 'huggingface cache', 'huggingface cache'),
    ('/var/cache/apt/archives', None, None),
    ('/var/cache/apt/archives/a.deb', 'apt cache', 'apt cache'),
    ('/var/cache/apt/archives/lock', None, None),
    ('/var/cache/apt/archives/partial', None, None),
    ('/var/cache/apt/archives/partial/a.deb.part', 'apt cache', 'apt cache'),
    ('/var/cache/apt/archives/x/y', None, None),
    ('/var/cache/apt/archives/a.debx', None, None),
    ('/r/releases', 'fleet files', 'fleet files'),
    ('/r/releases/aaa', 'releases', 'releases'),
    ('/r/releases/aaa/node', 'releases', 'releases'),
    ('/r/releases/aaa.partial', 'releases', 'releases'),
    ('/r/releases/bbb', 'old releases', 'releases'),
    ('/r/releases/bbb/node', 'old releases', 'releases'),
    ('/r/releases/bbb.partial/x', 'old releases', 'releases'),
    ('/r/releases/.partial', 'old releases', 'releases'),
    ('/r/log', 'fleet files', 'fleet files'),
    ('/r/log/agent.log', 'logs', 'logs'),
    ('/r/log/agent.log.1', 'logs', 'logs'),
    ('/r/log/agent.log.3', 'logs', 'logs'),
    ('/r/log/agent.log.4', 'rotated logs', 'rotated logs'),
    ('/r/log/agent.log.10', 'rotated logs', 'rotated logs'),
    ('/r/log/node.txt', 'logs', 'logs'),
    ('/r/log/sub/a.log', 'fleet files', 'fleet files'),
    ('/r/log/x.', 'logs', 'logs'),
    ('/r/log/.5', 'logs', 'logs'),
    ('/r/out', 'fleet files', 'fleet files'),
    ('/r/out/a.log', 'logs', 'logs'),
    ('/r/out/a.log.2', 'logs', 'logs'),
    ('/r/out/a.log.9', 'rotated logs', 'rotated logs'),
    ('/r/out/a.txt', 'fleet files', 'fleet files'),
    ('/r/out/a.txt.1', 'logs', 'logs'),
    ('/r/out/a.txt.7', 'rotated logs', 'rotated logs'),
    ('/r/out/d/a.log', 'fleet files', 'fleet files'),
    ('/r/jobs', 'job outputs', 'job outputs'),
    ('/r/jobs/j1', 'job outputs', 'job outputs'),
    ('/r/jobs/j1/out/x', 'job outputs', 'job outputs'),
    ('/r/pack', 'pack', 'pack'),
    ('/r/pack/a', 'pack', 'pack'),
    ('/r/pack.1', 'old pack exports', 'old pack exports'),
    ('/r/pack.json', 'fleet files', 'fleet files'),
    ('/r/pack.old/x', 'old pack exports', 'old pack exports'),
    ('/r/packx', 'fleet files', 'fleet files'),
    ('/r/models', 'models', 'models'),
    ('/r/models/m.bin', 'models', 'models'),
    ('/r/cache', 'fleet files', 'fleet files'),
    ('/r/cache/x', 'huggingface cache', 'toolchain cache in use'),
    ('/r/cache/a/b', 'huggingface cache', 'toolchain cache in use'),
    ('/r/snapshots', 'fleet files', 'fleet files'),
    ('/r/snapshots/s1', 'recovery snapshots', 'snapshots in use'),
    ('/r/snapshots/s1/f', 'recovery snapshots', 'snapshots in use'),
    ('/r/agent.toml', 'fleet files', 'fleet files'),
    ('/r/venv/bin/python', 'fleet files', 'fleet files'),
    ('/r/run/state.json', 'fleet files', 'fleet files'),
    ('/r/log.1', 'fleet files', 'fleet files'),
    ('/r/models.1', 'fleet files', 'fleet files'),
    ('/r/jobs.old', 'fleet files', 'fleet files'),
]


@pytest.mark.parametrize(("path", "read", "unread"), CASES)
def test_each_path_has_the_category_it_had(path: str, read: str | None,
                                           unread: str | None) -> None:
    assert (READ.category(Path(path)), UNREAD.category(Path(path))) == (read, unread)
