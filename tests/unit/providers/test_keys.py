"""Key resolution: environment first, then each provider CLI's key files (HOME is a tmp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest
from provider_fakes import CANARY

from fleet.core.errors import AuthFailed
from fleet.providers.keys import resolve_key


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_environment_wins_over_files(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(home / ".vast_api_key", "from-file")
    monkeypatch.setenv("VAST_API_KEY", " from-env\n")
    assert resolve_key("vast").value == "from-env"


def test_runpod_config_toml(home: Path) -> None:
    write(home / ".runpod" / "config.toml", '[default]\napi_key = "rp-file-key"\n')
    assert resolve_key("runpod").value == "rp-file-key"


def test_vast_xdg_then_dot_config_then_legacy(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(home / ".vast_api_key", "legacy\n")
    assert resolve_key("vast").value == "legacy"
    write(home / ".config" / "vastai" / "vast_api_key", "dot-config\n")
    assert resolve_key("vast").value == "dot-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    write(home / "xdg" / "vastai" / "vast_api_key", "xdg\n")
    assert resolve_key("vast").value == "xdg"


@pytest.mark.parametrize("provider, var, file", [
    ("runpod", "RUNPOD_API_KEY", "~/.runpod/config.toml"),
    ("vast", "VAST_API_KEY", "~/.vast_api_key"),
])
def test_missing_key_names_the_variable_and_the_file(provider: str, var: str, file: str) -> None:
    with pytest.raises(AuthFailed) as e:
        resolve_key(provider)
    assert e.value.provider == provider
    assert var in e.value.hint and file in e.value.hint


def test_empty_files_and_empty_env_count_as_missing(home: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "  ")
    write(home / ".vast_api_key", "\n")
    with pytest.raises(AuthFailed):
        resolve_key("vast")


def test_malformed_toml_never_quotes_the_file(home: Path) -> None:
    write(home / ".runpod" / "config.toml", f'[default]\napi_key = "{CANARY}\n')
    with pytest.raises(AuthFailed) as e:
        resolve_key("runpod")
    assert CANARY not in str(e.value) and CANARY not in repr(e.value)
    assert e.value.__cause__ is None and e.value.__context__ is None


def test_the_key_never_shows_in_a_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", CANARY)
    key = resolve_key("runpod")
    assert key.value == CANARY
    assert CANARY not in repr(key) and CANARY not in str(key) and CANARY not in f"{key}"
