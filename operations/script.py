"""The shell programs the operations run on a box, kept as package files (``scripts/``) so
that they read, lint and diff as shell.

Each is a Jinja2 template of the contract's names (paths under the fleet root, file names),
rendered with ``StrictUndefined``: a name the template asks for and the caller did not give is
an error, never an empty string. The scripts place the values inside paths, some of them
double-quoted, so each must be one word the shell reads as itself (``shlex.quote`` leaves it
unchanged); anything else is refused rather than quoted into a different path. What changes
per run (a tarball, digests, the root of a command) is passed to the script as its arguments;
only ``boot.sh``, a file kept on the box, has its root in its text.
"""

from __future__ import annotations

import shlex

from jinja2 import Environment, PackageLoader, StrictUndefined


def _word(value: object) -> str:
    text = str(value)
    if not text or shlex.quote(text) != text:
        raise ValueError(f"{text!r} is not a plain shell word; the scripts take such values "
                         "as their arguments")
    return text


_ENV = Environment(loader=PackageLoader("operations", "scripts"), undefined=StrictUndefined,
                   keep_trailing_newline=True, autoescape=False, finalize=_word)


def render(name: str, **values: object) -> str:
    """The script ``scripts/<name>.sh.j2`` with ``values`` in place.

    + name: the script's name, e.g. ``release_point``
    + values: every name the template uses

    **Example:**

    .. code:: python

        POINT_SCRIPT = render("release_point", RUN=RUN, POINTER=POINTER, ...)
    """
    return _ENV.get_template(f"{name}.sh.j2").render(**values)
