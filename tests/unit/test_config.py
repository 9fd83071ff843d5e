import os
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


# ---------------------------------------------------------------- the GPU guard and health


def test_gpu_programs_default_to_the_miner_and_the_prover(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, GOOD.replace('"node", "miner"', '"node", "miner", "prover"')))
    live = cfg.roles["live"]
    assert live.gpu_programs == ("miner", "prover")
    assert live.needs_gpu("miner") and live.needs_gpu("prover") and not live.needs_gpu("node")
    shipped = load(ROOT / "fleet.toml").roles["live"]
    assert shipped.gpu_programs == ("miner", "prover") and shipped.admitted_driver


def test_gpu_programs_can_be_named(tmp_path: Path) -> None:
    text = GOOD.replace('p2p_port = 26611', 'p2p_port = 26611\ngpu_programs = ["node", "miner"]')
    assert load(write(tmp_path, text)).roles["live"].gpu_programs == ("node", "miner")
    # no GPU program at all: no driver needed (the node alone runs on any box)
    text = GOOD.replace('admitted_driver = "580.95.05"\n', 'gpu_programs = []\n')
    assert load(write(tmp_path, text)).roles["live"].gpu_programs == ()


def test_node_restart_after_unhealthy_defaults_to_300_s(tmp_path: Path) -> None:
    assert load(write(tmp_path, GOOD)).roles["live"].node_unhealthy_restart_s == 300
    text = GOOD.replace("p2p_port = 26611", "p2p_port = 26611\nnode_unhealthy_restart_s = 0")
    assert load(write(tmp_path, text)).roles["live"].node_unhealthy_restart_s == 0


@pytest.mark.parametrize(
    "text, message",
    [
        # a role whose programs use the GPU must name the driver they are admitted on
        (GOOD.replace('admitted_driver = "580.95.05"\n', ""),
         "roles.live: miner needs the GPU but admitted_driver is not set"),
        (GOOD.replace('admitted_driver = "580.95.05"', 'admitted_driver = ""'),
         "roles.live: miner needs the GPU but admitted_driver is not set"),
        (GOOD.replace('programs = ["node", "miner"]',
                      'programs = ["node", "prover"]').replace('admitted_driver = "580.95.05"\n',
                                                               ""),
         "roles.live: prover needs the GPU but admitted_driver is not set"),
        (GOOD.replace("p2p_port = 26611", 'p2p_port = 26611\ngpu_programs = ["prover"]'),
         "roles.live.gpu_programs: 'prover' is not one of the role's programs"),
        (GOOD.replace("p2p_port = 26611", 'p2p_port = 26611\ngpu_programs = "miner"'),
         "roles.live.gpu_programs: expected list"),
        (GOOD.replace("p2p_port = 26611", "p2p_port = 26611\nnode_unhealthy_restart_s = -1"),
         "roles.live.node_unhealthy_restart_s: must be 0 (report only) or more"),
        (GOOD.replace("p2p_port = 26611", "p2p_port = 26611\nnode_unhealthy_restart_s = true"),
         "roles.live.node_unhealthy_restart_s: expected int or float, got bool"),
    ],
)
def test_gpu_and_health_mistakes_are_one_clear_line(tmp_path: Path, text: str,
                                                    message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, text))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_the_cli_refuses_an_unguarded_gpu_role(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write(tmp_path, GOOD.replace('admitted_driver = "580.95.05"\n', ""))
    # no provider keys and a home of its own: a config that loaded could reach nothing
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "VAST_"))}
    env["HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-m", "fleet.cli", "--config", str(path), "roster"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
    assert "miner needs the GPU but admitted_driver is not set" in done.stderr
