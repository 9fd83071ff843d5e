"""The page's compiled template (`fleet.page.compiled`) is reused only while it is exactly what
compiling would give, and a cache that cannot be used never stops the page."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from jinja2 import DictLoader, Environment

from fleet.page.compiled import CompiledTemplates

SOURCE = "{% for x in xs %}\n  <li>{{ x | shout }}</li>\n{% endfor %}\n"


def env(folder: Path, source: str = SOURCE, **kw: object) -> Environment:
    """A fresh environment (a process of its own, as far as its template cache goes)."""
    e = Environment(loader=DictLoader({"t.j2": source}), bytecode_cache=CompiledTemplates(folder),
                    **kw)  # type: ignore[arg-type]
    e.filters["shout"] = lambda s: f"{s}!"
    return e


def plain(source: str = SOURCE, **kw: object) -> str:
    e = Environment(loader=DictLoader({"t.j2": source}), **kw)  # type: ignore[arg-type]
    e.filters["shout"] = lambda s: f"{s}!"
    return e.get_template("t.j2").render(xs=["a", "<b>"])


def draw(e: Environment) -> str:
    return e.get_template("t.j2").render(xs=["a", "<b>"])


def test_the_second_process_runs_the_first_ones_code(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "page"
    assert draw(env(folder)) == plain()
    (kept,) = folder.glob("*.jinja")
    assert (os.stat(folder).st_mode & 0o777, os.stat(kept).st_mode & 0o777) == (0o700, 0o600)

    def no_compiling(*a: object, **k: object) -> None:
        raise AssertionError("compiled again")

    second = env(folder)
    monkeypatch.setattr(second, "compile", no_compiling)
    assert draw(second) == plain()


@pytest.mark.parametrize("change", [
    {"source": SOURCE.replace("<li>", "<li class=x>")},  # the template
    {"trim_blocks": True},  # a setting that shapes the code
    {"autoescape": True},
    {"variable_start_string": "{{", "variable_end_string": "}}", "lstrip_blocks": True},
])
def test_any_change_to_what_the_code_depends_on_compiles_it_anew(
        tmp_path: Path, change: dict[str, object]) -> None:
    folder = tmp_path / "page"
    draw(env(folder))
    assert draw(env(folder, **change)) == plain(**change)  # type: ignore[arg-type]
    assert draw(env(folder)) == plain()  # and the first one is still itself


def test_a_garbled_or_cut_file_is_compiled_anew(tmp_path: Path) -> None:
    folder = tmp_path / "page"
    draw(env(folder))
    (kept,) = folder.glob("*.jinja")
    whole = kept.read_bytes()
    for bad in (whole[: len(whole) // 2], whole[:5], b"", b"j2" + os.urandom(200)):
        kept.write_bytes(bad)
        assert draw(env(folder)) == plain()


def test_a_cache_that_cannot_be_used_is_passed_by(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("in the way")
    assert draw(env(blocked / "page")) == plain()  # cannot be made: drawn all the same
    shared = tmp_path / "shared"
    draw(env(shared))
    shared.chmod(0o777)  # another user could put code here: never run, never written
    (kept,) = shared.glob("*.jinja")
    kept.write_bytes(b"garbage that must not be read")
    assert draw(env(shared, source=SOURCE + "more\n")) == plain(SOURCE + "more\n")
    assert kept.read_bytes() == b"garbage that must not be read"
    assert len(list(shared.glob("*.jinja"))) == 1


def test_a_setting_without_a_stable_name_is_never_reused(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "page"
    draw(env(folder, finalize=lambda v: v))
    second = env(folder, finalize=lambda v: v)  # another function: its repr differs
    compiled: list[str] = []
    real = second.compile
    monkeypatch.setattr(second, "compile", lambda *a, **k: compiled.append("x") or real(*a, **k))
    draw(second)
    assert compiled == ["x"]


def test_the_fleet_page_uses_it_in_the_users_cache(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from fleet.page import html

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = html._env.bytecode_cache
    assert isinstance(cache, CompiledTemplates)
    assert cache._where() == tmp_path / "fleet" / "page"
