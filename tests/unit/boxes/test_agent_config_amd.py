"""agent.toml for the box's own card: an AMD box's agent is told its vendor and admitted on the
exact amdgpu driver and ROCm release; an NVIDIA box's file stays what it was, so a second
deploy of an existing box is a no-op; a card whose vendor cannot be told is never rendered."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest
from repo_root import ROOT

from fleet.boxes.agent_config import render
from fleet.core.config import Role, load
from fleet.core.errors import ConfigError

SHA16 = "04c82f6f904c054d"


def mixed_role() -> Role:
    return dataclasses.replace(load(ROOT / "fleet.toml").role("live"),
                               admitted_amdgpu="6.12.12", admitted_rocm="6.4.1",
                               allowed_rocm=("6.4",))


def test_an_amd_box_is_told_its_vendor_and_the_exact_amd_pair() -> None:
    doc = tomllib.loads(render(mixed_role(), SHA16, "MI300X"))
    assert doc["gpu_vendor"] == "amd"
    assert doc["admitted_driver"] == "6.12.12"  # the amdgpu driver, never the NVIDIA one
    assert doc["admitted_rocm"] == "6.4.1"
    assert doc["programs"]["miner"]["needs_gpu"] is True


def test_an_amd_card_in_another_spelling_is_the_same_vendor() -> None:
    assert tomllib.loads(render(mixed_role(), SHA16, "AMD Instinct MI300X OAM"))[
        "gpu_vendor"] == "amd"


def test_an_nvidia_box_renders_byte_for_byte_as_before() -> None:
    # the text the renderer wrote before AMD cards (fleet.toml's live role): any change would
    # restart every standing agent on the next deploy
    before = (ROOT / "tests/unit/data/agent_toml_nvidia_live.toml").read_text()
    assert render(mixed_role(), SHA16, "RTX 4090") == before
    assert "gpu_vendor" not in before and "rocm" not in before


@pytest.mark.parametrize("card", ["", "RTX 9999", "Intel Arc A770"])
def test_a_card_whose_vendor_cannot_be_told_is_refused(card: str) -> None:
    with pytest.raises(ConfigError, match=f"card {card!r}: its vendor cannot be told"):
        render(mixed_role(), SHA16, card)


def test_an_amd_box_of_a_role_without_the_pair_is_never_rendered() -> None:
    nvidia_only = load(ROOT / "fleet.toml").role("live")
    with pytest.raises(ConfigError, match="admitted_amdgpu and admitted_rocm are not set"):
        render(nvidia_only, SHA16, "RX 7900 XTX")
