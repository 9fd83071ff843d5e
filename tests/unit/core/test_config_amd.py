"""fleet.toml roles for AMD cards: the exact amdgpu driver and ROCm release an AMD box's GPU
programs may run on, the ROCm releases offers may carry, and the guard that refuses a GPU role
without the pair its roster's cards need."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.core.config import load
from fleet.core.errors import ConfigError

ROLE = """
[fleet]
daily_budget_usd = 50
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node", "miner"]
p2p_port = 26611
"""
NVIDIA_DRIVER = 'admitted_driver = "580.95.05"\n'
AMD_PAIR = 'admitted_amdgpu = "6.12.12"\nadmitted_rocm = "6.4.1"\nallowed_rocm = ["6.4"]\n'
NVIDIA_ENTRY = '[[roster.live]]\nprovider = "vast"\ncard = "RTX 4090"\n'
AMD_ENTRY = '[[roster.live]]\nprovider = "vast"\ncard = "MI300X"\n'


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "fleet.toml"
    p.write_text(text)
    return p


def refusal(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, text))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_mixed_roster_with_both_drivers_loads(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, ROLE + NVIDIA_DRIVER + AMD_PAIR + NVIDIA_ENTRY + AMD_ENTRY))
    role = cfg.role("live")
    assert (role.admitted_driver, role.admitted_amdgpu, role.admitted_rocm) == (
        "580.95.05", "6.12.12", "6.4.1")
    assert role.allowed_rocm == ("6.4",)
    assert [w.card for w in cfg.roster] == ["RTX 4090", "MI300X"]


def test_the_rocm_lines_searched_default_to_the_admitted_release_s_line(tmp_path: Path) -> None:
    text = ROLE + AMD_PAIR.replace('allowed_rocm = ["6.4"]\n', "") + AMD_ENTRY
    assert load(write(tmp_path, text)).role("live").allowed_rocm == ("6.4",)


def test_an_amd_only_role_needs_no_nvidia_driver(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, ROLE + AMD_PAIR + AMD_ENTRY))
    assert cfg.role("live").admitted_driver is None


def test_a_role_without_roster_entries_may_name_the_amd_pair_alone(tmp_path: Path) -> None:
    assert load(write(tmp_path, ROLE + AMD_PAIR)).role("live").admitted_rocm == "6.4.1"


@pytest.mark.parametrize("text, message", [
    (ROLE + NVIDIA_DRIVER + AMD_ENTRY,
     "roster.live[0]: MI300X is an AMD card and miner needs the GPU, but roles.live names no "
     "admitted_amdgpu"),
    (ROLE + NVIDIA_DRIVER + 'admitted_amdgpu = "6.12.12"\n' + AMD_ENTRY,
     "fleet.toml: roles.live: admitted_amdgpu without admitted_rocm"),
    (ROLE + NVIDIA_DRIVER + 'admitted_rocm = "6.4.1"\n' + AMD_ENTRY,
     "roles.live: admitted_rocm without admitted_amdgpu"),
    (ROLE + AMD_PAIR + NVIDIA_ENTRY,
     "roster.live[0]: RTX 4090 is an NVIDIA card and miner needs the GPU, but roles.live names "
     "no admitted_driver"),
    (ROLE + AMD_PAIR + AMD_ENTRY + NVIDIA_ENTRY,
     "roster.live[1]: RTX 4090 is an NVIDIA card and miner needs the GPU"),
    (ROLE, "roles.live: miner needs the GPU but admitted_driver is not set"),
    (ROLE + AMD_PAIR.replace('"6.12.12"', '"6.12"'),
     "roles.live.admitted_amdgpu: '6.12' is not an exact amdgpu driver version X.Y.Z"),
    (ROLE + AMD_PAIR.replace('"6.4.1"', '"6.4"'),
     "roles.live.admitted_rocm: '6.4' is not an exact ROCm release X.Y.Z"),
    (ROLE + AMD_PAIR.replace('["6.4"]', '["6.4.1"]'),
     "roles.live.allowed_rocm: '6.4.1' is not a ROCm release X.Y"),
    (ROLE + AMD_PAIR.replace('["6.4"]', '"6.4"'),
     "roles.live.allowed_rocm: expected list, got str"),
    (ROLE + AMD_PAIR.replace('["6.4"]', '["6.3"]'),
     "roles.live.allowed_rocm: ['6.3'] leaves out 6.4, the line of admitted_rocm 6.4.1"),
    (ROLE + NVIDIA_DRIVER + 'allowed_rocm = ["6.4"]\n',
     "roles.live.allowed_rocm: set without admitted_amdgpu and admitted_rocm"),
    (ROLE.replace('"standing"', '"oneshot"').replace('programs = ["node", "miner"]\n', "")
     + NVIDIA_DRIVER + AMD_PAIR,
     "roles.live.admitted_amdgpu: one-shot jobs run on NVIDIA cards only"),
])
def test_each_amd_mistake_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    assert message in refusal(tmp_path, text)


def test_a_one_shot_role_refuses_an_amd_card(tmp_path: Path) -> None:
    text = (ROLE.replace('"standing"', '"oneshot"').replace('programs = ["node", "miner"]\n', "")
            + NVIDIA_DRIVER + AMD_ENTRY)
    assert ("roster.live[0]: MI300X is an AMD card; one-shot jobs run on NVIDIA cards only"
            in refusal(tmp_path, text))


def test_a_role_whose_gpu_programs_are_none_takes_an_amd_card_without_the_pair(
        tmp_path: Path) -> None:
    cfg = load(write(tmp_path, ROLE + "gpu_programs = []\n" + AMD_ENTRY))
    assert cfg.role("live").gpu_programs == ()


def test_the_cli_refuses_an_amd_roster_without_the_pair_with_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, ROLE + NVIDIA_DRIVER + AMD_ENTRY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VAST_"))}
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "fleet.cli", "--config", str(path), "roster"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "MI300X is an AMD card and miner needs the GPU" in done.stderr
