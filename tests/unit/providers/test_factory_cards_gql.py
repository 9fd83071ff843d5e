"""The factory, the card table and the GraphQL literal printer."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from graphql import parse
from graphql.utilities import value_from_ast_untyped
from provider_fakes import CANARY

from fleet.core import cards
from fleet.core.errors import AuthFailed, UsageError
from fleet.providers.factory import all_providers, get_provider
from fleet.providers.gql import Enum, literal, operation
from fleet.providers.runpod import RunPod
from fleet.providers.vast import Vast


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("RUNPOD_API_KEY", "VAST_API_KEY", "RUNPOD_API_BASE_URL", "VAST_URL",
                "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)


def test_factory_reads_urls_and_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", CANARY)
    monkeypatch.setenv("VAST_API_KEY", "v-key")
    monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:9/")
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"data": {"myself": {"pods": []}}})

    rp = get_provider("runpod", transport=httpx.MockTransport(handler))
    assert isinstance(rp, RunPod) and rp.boxes() == []
    assert str(seen[0].url) == "http://127.0.0.1:9/graphql"
    assert seen[0].headers["Authorization"] == f"Bearer {CANARY}"
    assert CANARY not in repr(rp)
    provs = all_providers()
    assert sorted(provs) == ["runpod", "vast"] and isinstance(provs["vast"], Vast)
    assert str(provs["vast"].http._client.base_url) == "https://console.vast.ai"


def test_factory_defaults_to_the_real_services(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_API_KEY", "k")
    assert str(get_provider("runpod").http._client.base_url) == "https://api.runpod.io"


def test_missing_key_and_unknown_name() -> None:
    with pytest.raises(AuthFailed) as e:
        get_provider("vast")
    assert "VAST_API_KEY" in str(e.value)
    with pytest.raises(UsageError):
        get_provider("aws")


@pytest.mark.parametrize("fleet_name, runpod_id, display", [
    ("RTX 4090", "NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("H100 SXM", "NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("A100 SXM4", "NVIDIA A100-SXM4-80GB", "A100 SXM"),
    ("RTX A6000", "NVIDIA RTX A6000", "RTX A6000"),
    ("L40S", "NVIDIA L40S", "L40S"),
])
def test_card_names(fleet_name: str, runpod_id: str, display: str) -> None:
    assert cards.runpod_type_id(fleet_name) == runpod_id
    assert cards.from_runpod(runpod_id) == fleet_name
    assert cards.from_runpod(display) == fleet_name


def test_unknown_cards_pass_through() -> None:
    assert cards.runpod_type_id("NVIDIA Future 9000") == "NVIDIA Future 9000"
    assert cards.from_runpod("NVIDIA Future 9000") == "NVIDIA Future 9000"
    assert cards.from_runpod(None) == ""


def test_literals_survive_hostile_strings() -> None:
    value = {"name": 'x" } mutation { podTerminate', "env": [{"key": "K", "value": "a\nb\\c"}],
             "n": 2, "f": 0.25, "on": True, "none": None, "cloud": Enum("SECURE")}
    doc = parse(operation("mutation", "podFindAndDeployOnDemand", {"input": value}, "id"))
    field = doc.definitions[0].selection_set.selections[0]  # type: ignore[attr-defined]
    assert len(doc.definitions) == 1 and field.name.value == "podFindAndDeployOnDemand"
    parsed = value_from_ast_untyped(field.arguments[0].value)
    assert parsed == {**value, "cloud": "SECURE"}
    assert "cloud: SECURE" in literal(value)
    with pytest.raises(TypeError):
        literal(object())


def test_an_operator_with_one_provider_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "k")
    assert sorted(all_providers()) == ["vast"]  # no RunPod key: RunPod is simply not asked
    monkeypatch.delenv("VAST_API_KEY")
    with pytest.raises(AuthFailed, match="RUNPOD_API_KEY"):
        all_providers()
