"""The page's template compiled once per version of it, kept in the user's cache
(`$XDG_CACHE_HOME/fleet/page/`, `fleet.core.paths.user_cache`).

Compiling `index.html.j2` into Python is most of what drawing the page costs a process that
draws it once: every `fleet loop --once` and `fleet page`. The code is used only while it is
exactly what compiling would give: its checksum covers the template's text, jinja2's and
Python's versions and every setting of the environment that shapes the code (`fingerprint`);
a setting that cannot be named the same way twice (a function of its own) never matches, so
that template is compiled every time. A file that cannot be read whole is compiled anew; a
cache that cannot be written, or a folder another user could write, is not used at all.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

import jinja2
from jinja2.bccache import Bucket, BytecodeCache

from fleet.core.fileutil import write_atomic
from fleet.core.paths import user_cache

# the settings of an Environment that shape the code a template compiles into
_SHAPING = ("block_start_string", "block_end_string", "variable_start_string",
            "variable_end_string", "comment_start_string", "comment_end_string",
            "line_statement_prefix", "line_comment_prefix", "trim_blocks", "lstrip_blocks",
            "newline_sequence", "keep_trailing_newline", "optimized", "autoescape", "finalize",
            "is_async", "code_generator_class", "context_class", "template_class")


def fingerprint(env: jinja2.Environment) -> str:
    """Everything but the template's text that its compiled code depends on, as text."""
    parts = [jinja2.__version__, sys.version, repr(type(env))]
    parts += [f"{k}={getattr(env, k)!r}" for k in _SHAPING]
    parts += [repr(sorted(env.extensions)), repr(sorted(env.filters)), repr(sorted(env.tests)),
              repr(sorted(env.policies.items()))]
    return "\n".join(parts)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _ours(folder: Path) -> bool:
    """A folder of this user's that no other user can write (only then is its code run)."""
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


class CompiledTemplates(BytecodeCache):
    """A jinja2 bytecode cache, exact as the module says.

    + folder: where the compiled templates are kept (default: `user_cache() / "page"`, looked
      up at each use)

    Example: `Environment(loader=..., bytecode_cache=CompiledTemplates())`
    """

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder

    def _where(self) -> Path:
        return self.folder if self.folder is not None else user_cache() / "page"

    def get_bucket(self, environment: jinja2.Environment, name: str, filename: str | None,
                   source: str) -> Bucket:
        key = _sha256(f"{name}|{filename}")
        bucket = Bucket(environment, key, _sha256(f"{fingerprint(environment)}\0{source}"))
        self.load_bytecode(bucket)
        return bucket

    def load_bytecode(self, bucket: Bucket) -> None:
        folder = self._where()
        if not _ours(folder):
            return
        try:
            with open(folder / f"{bucket.key}.jinja", "rb") as f:
                bucket.load_bytecode(f)  # another checksum, jinja2 or Python: left empty
        except FileNotFoundError:
            return
        except Exception:  # cut short or garbled in any way: compiled anew
            bucket.reset()

    def dump_bytecode(self, bucket: Bucket) -> None:
        folder = self._where()
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if _ours(folder):
                write_atomic(folder / f"{bucket.key}.jinja", bucket.bytecode_to_string(),
                             mode=0o600)
        except OSError:  # a read-only home, a full disk: the page is drawn all the same
            return

    def clear(self) -> None:
        for p in self._where().glob("*.jinja"):
            p.unlink(missing_ok=True)

