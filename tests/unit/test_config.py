from pathlib import Path

import pytest

from fleet.config import load
from fleet.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "fleet.toml"
    p.write_text(text)
    return p


GOOD = """
[fleet]
daily_budget_usd = 50
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node", "miner"]
p2p_port = 26611
admitted_driver = "580.95.05"
[[roster.live]]
provider = "vast"
card = "RTX 4090"
count = 2
"""


def test_shipped_config_loads() -> None:
    cfg = load(ROOT / "fleet.toml")
    assert cfg.roles["live"].kind == "standing"
    assert cfg.roles["live"].tcp_ports == (22, 26611)
    assert {w.provider for w in cfg.roster} == {"vast", "runpod"}


def test_good_config(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, GOOD))
    assert cfg.daily_budget_usd == 50.0
    assert cfg.registry == tmp_path / "state" / "boxes.json"
    (want,) = cfg.roster
    assert (want.role, want.provider, want.card, want.gpus, want.count) == (
        "live", "vast", "RTX 4090", 1, 2)


@pytest.mark.parametrize(
    "text, message",
    [
        (GOOD + "\n[extra]\n", "unknown key 'extra'"),
        (GOOD.replace("disk_gb = 20", "disk_gb = \"20\""), "roles.live.disk_gb: expected int"),
        (GOOD.replace("disk_gb = 20", "disk_gb = true"), "expected int, got bool"),
        (GOOD.replace('kind = "standing"', 'kind = "forever"'), "kind: expected one of"),
        (GOOD.replace('"node", "miner"', '"node", "gpu-burner"'), "unknown program 'gpu-burner'"),
        (GOOD + '[[roster.dn2]]\nprovider = "vast"\ncard = "x"\n', "unknown role 'dn2'"),
        (GOOD.replace('provider = "vast"', 'provider = "aws"'), "provider: expected one of"),
        (GOOD.replace("daily_budget_usd = 50", "daily_budget_usd = -1"), "must be positive"),
        (GOOD.replace("p2p_port = 26611", "p2p_port = 70000"), "is not a TCP port"),
        ("[fleet\n", "not valid TOML"),
        (GOOD.replace('image = "img"\n', ""), "missing key 'image'"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, text))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "nope.toml")


def test_unknown_role_lookup(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, GOOD))
    with pytest.raises(ConfigError, match="unknown role 'bench' \\(roles: live\\)"):
        cfg.role("bench")
