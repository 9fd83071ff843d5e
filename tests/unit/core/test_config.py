import os
import re
from pathlib import Path

import pytest
from repo_root import ROOT

from fleet.core.config import load
from fleet.core.errors import ConfigError


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
        (GOOD.replace("p2p_port = 26611", 'p2p_port = 26611\nspread = "no"'),
         "roles.live.spread: expected bool, got str"),
        (GOOD + "[loop]\nmove_timeout_s = 0\n", "loop.move_timeout_s: must be positive"),
        (GOOD + "[loop]\nrestart_timeout_s = 0\n", "loop.restart_timeout_s: must be positive"),
    ],
)
def test_bad_config_is_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, text))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_spread_is_on_unless_a_role_turns_it_off(tmp_path: Path) -> None:
    assert load(write(tmp_path, GOOD)).roles["live"].spread is True
    off = GOOD.replace("p2p_port = 26611", "p2p_port = 26611\nspread = false")
    assert load(write(tmp_path, off)).roles["live"].spread is False


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


# ---------------------------------------------------------------- roster cards


@pytest.mark.parametrize("spelling", [
    "RTX 4090", "rtx 4090", "NVIDIA GeForce RTX 4090", "nvidia geforce rtx 4090", "RTX  4090",
])
def test_a_roster_card_in_any_spelling_is_the_fleet_name(tmp_path: Path, spelling: str) -> None:
    cfg = load(write(tmp_path, GOOD.replace('card = "RTX 4090"', f'card = "{spelling}"')))
    assert [w.card for w in cfg.roster] == ["RTX 4090"]


def test_a_roster_card_spelled_like_runpod_counts_as_filled_by_the_loop(tmp_path: Path) -> None:
    from fleet.cli.loop_cmd import page_after_tick
    from fleet.core.boxes import Row
    from fleet.ops.loop import Loop
    from fleet.state.loop_memory import Memory

    cfg = load(write(tmp_path, GOOD.replace('card = "RTX 4090"',
                                            'card = "NVIDIA GeForce RTX 4090"')))
    loop = Loop(cfg, {}, after_tick=page_after_tick(cfg, tmp_path / "page"), echo=lambda _: None,
                check_fn=lambda *_: [], converge_fn=lambda *_: None)
    for i in range(2):  # the two boxes the roster wants, as the registry records them
        loop.reg.add(Row(label=f"live-vast-00000{i}", provider="vast", role="live",
                         kind="standing", card="RTX 4090", gpu_count=1, usd_per_hour=0.3,
                         status="running", provider_id=str(i), standing=True))
    assert loop.owed(Memory()) == []


def test_an_unknown_roster_card_is_one_line_naming_the_key_and_the_cards(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace('card = "RTX 4090"', 'card = "RTX 9999"'))
    with pytest.raises(ConfigError) as e:
        load(path)
    msg = str(e.value)
    assert "\n" not in msg
    assert str(path) in msg and "roster.live[0].card" in msg and "'RTX 9999'" in msg
    assert "RTX 4090" in msg and "H100 SXM" in msg


def test_two_roster_entries_of_one_shape_are_one_line(tmp_path: Path) -> None:
    twice = GOOD + '[[roster.live]]\nprovider = "vast"\ncard = "rtx 4090"\n'
    path = write(tmp_path, twice)
    with pytest.raises(ConfigError, match=r"roster.live\[1\]: the same vast RTX 4090 x1 as an "
                                          "earlier entry"):
        load(path)


# ---------------------------------------------------------------- numbers and names


def _loop(table: str) -> str:
    return GOOD + "[loop]\n" + table + "\n"


@pytest.mark.parametrize(("text", "key"), [
    (_loop("interval_s = nan"), "loop.interval_s"),
    (_loop("interval_s = inf"), "loop.interval_s"),
    (_loop("orphan_grace_s = nan"), "loop.orphan_grace_s"),
    (_loop("orphan_grace_s = inf"), "loop.orphan_grace_s"),
    (_loop("converge_timeout_s = inf"), "loop.converge_timeout_s"),
    (_loop("converge_timeout_s = -nan"), "loop.converge_timeout_s"),
    (_loop("ready_timeout_s = inf"), "loop.ready_timeout_s"),
    (GOOD.replace("daily_budget_usd = 50", "daily_budget_usd = inf"), "fleet.daily_budget_usd"),
    (GOOD.replace("daily_budget_usd = 50", "daily_budget_usd = nan"), "fleet.daily_budget_usd"),
    (GOOD.replace("p2p_port = 26611", "p2p_port = 26611\nnode_unhealthy_restart_s = nan"),
     "roles.live.node_unhealthy_restart_s"),
    (GOOD.replace("p2p_port = 26611", "p2p_port = 26611\nnode_unhealthy_restart_s = inf"),
     "roles.live.node_unhealthy_restart_s"),
])
def test_a_number_that_is_not_finite_is_one_line_naming_the_key(tmp_path: Path, text: str,
                                                                 key: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, text))
    msg = str(e.value)
    assert "\n" not in msg and f"{key}: must be a finite number" in msg, msg


@pytest.mark.parametrize("table", [
    "orphan_grace_s = 100",  # the default interval is 60
    "interval_s = 10\norphan_grace_s = 5",
    "interval_s = 10\norphan_grace_s = 0",
    "interval_s = 400",  # the default grace is 600
])
def test_the_orphan_grace_is_at_least_two_intervals(tmp_path: Path, table: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, _loop(table)))
    msg = str(e.value)
    assert "\n" not in msg and "loop.orphan_grace_s" in msg
    assert "at least two interval_s" in msg, msg


@pytest.mark.parametrize(("table", "key", "most"), [
    ("interval_s = 1e10\norphan_grace_s = 2e10", "interval_s", "3600 s"),
    ("interval_s = 3601\norphan_grace_s = 7202", "interval_s", "3600 s"),
    ("orphan_grace_s = 1e10", "orphan_grace_s", "86400 s"),
    ("converge_timeout_s = 1e10", "converge_timeout_s", "86400 s"),
    ("ready_timeout_s = 9223372036854775807", "ready_timeout_s", "86400 s"),
    ("move_timeout_s = 1e300", "move_timeout_s", "604800 s"),
    ("restart_timeout_s = 1e10", "restart_timeout_s", "86400 s"),
])
def test_a_loop_duration_past_its_bound_is_one_line_naming_the_key(tmp_path: Path, table: str,
                                                                   key: str, most: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, _loop(table)))
    msg = str(e.value)
    assert "\n" not in msg and f"loop.{key}: at most {most}" in msg, msg


def test_durations_at_their_bounds_load(tmp_path: Path) -> None:
    text = _loop("interval_s = 3600\norphan_grace_s = 86400\nconverge_timeout_s = 86400\n"
                 "ready_timeout_s = 86400\nmove_timeout_s = 604800\n"
                 "restart_timeout_s = 86400").replace(
        "p2p_port = 26611", "p2p_port = 26611\nnode_unhealthy_restart_s = 86400")
    cfg = load(write(tmp_path, text))
    assert (cfg.loop.interval_s, cfg.loop.move_timeout_s) == (3600, 604800)
    assert cfg.loop.restart_timeout_s == 86400
    assert cfg.roles["live"].node_unhealthy_restart_s == 86400


def test_a_node_restart_delay_past_a_day_is_one_line(tmp_path: Path) -> None:
    text = GOOD.replace("p2p_port = 26611", "p2p_port = 26611\nnode_unhealthy_restart_s = 1e10")
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, text))
    msg = str(e.value)
    assert "\n" not in msg and "roles.live.node_unhealthy_restart_s: at most 86400 s" in msg, msg


def test_an_orphan_grace_of_exactly_two_intervals_is_fine(tmp_path: Path) -> None:
    loop = load(write(tmp_path, _loop("interval_s = 10\norphan_grace_s = 20"))).loop
    assert (loop.interval_s, loop.orphan_grace_s) == (10, 20)


def test_the_ready_timeout_defaults_to_1800_s_and_must_be_positive(tmp_path: Path) -> None:
    assert load(write(tmp_path, GOOD)).loop.ready_timeout_s == 1800
    assert load(write(tmp_path, _loop("ready_timeout_s = 900"))).loop.ready_timeout_s == 900
    for bad in ("0", "-5"):
        with pytest.raises(ConfigError, match="loop.ready_timeout_s: must be positive"):
            load(write(tmp_path, _loop(f"ready_timeout_s = {bad}")))
    with pytest.raises(ConfigError, match="loop.ready_timeout_s: expected int or float"):
        load(write(tmp_path, _loop('ready_timeout_s = "soon"')))


def _role_named(name: str) -> str:
    return GOOD.replace("[roles.live]", f'[roles."{name}"]').replace(
        "[[roster.live]]", f'[[roster."{name}"]]')


@pytest.mark.parametrize("name", [
    "Live", "live_1", "-x", "x-", "a--b", "1live", "live.1", "a" * 21, "",
])
def test_a_role_name_no_label_can_hold_is_one_line(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, _role_named(name)))
    msg = str(e.value)
    assert "\n" not in msg and f"bad role name {name!r}" in msg, msg


@pytest.mark.parametrize("name", ["live", "live-2", "a1-b2-c3", "a" * 20])
def test_role_names_a_label_can_hold_load(tmp_path: Path, name: str) -> None:
    assert list(load(write(tmp_path, _role_named(name))).roles) == [name]


def test_the_sandbox_configs_load(tmp_path: Path) -> None:
    from sandbox import fleet_toml

    for text in (fleet_toml.render(tmp_path / "state"),
                 fleet_toml.render(tmp_path / "state", roles=fleet_toml.LIVE_ROLE
                                   + fleet_toml.BENCH_ROLE, roster=fleet_toml.ROSTER_4090,
                                   store=True),
                 fleet_toml.render(tmp_path / "state", roster=fleet_toml.ROSTER_4090,
                                   loop={"interval_s": 10, "dead_checks": 2,
                                         "orphan_grace_s": 20})):
        cfg = load(write(tmp_path, text))
        assert cfg.loop.orphan_grace_s >= 2 * cfg.loop.interval_s


@pytest.mark.parametrize(("change", "says"), [
    (('admitted_driver = "580.95.05"', 'admitted_driver = "580.95"'),
     "admitted_driver: '580.95' is not an exact NVIDIA driver version"),
    (('kind = "standing"', 'kind = "standing"\nallowed_cuda = ["12.x"]'),
     "allowed_cuda: '12.x' is not a CUDA version"),
    (("[fleet]", "[loop]\nready_timeout_s = 60\n[fleet]"),
     "loop.ready_timeout_s: at least 300 s, got 60"),
])
def test_a_driver_or_cuda_the_loop_could_not_search_with_is_refused_at_load(
        tmp_path: Path, change: tuple[str, str], says: str) -> None:
    assert change[0] in GOOD
    with pytest.raises(ConfigError, match=re.escape(says)):
        load(write(tmp_path, GOOD.replace(change[0], change[1], 1)))
