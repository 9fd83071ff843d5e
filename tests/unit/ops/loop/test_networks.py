"""Networks: roles whose boxes carry different duties and form one mesh. The config's rules,
the peers file naming the network's other boxes, and the star-only rule, the owed ports and
`fleet mesh` counting network mates."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import page_fixture as F
import pytest
from check_fixture import status
from repo_root import ROOT

from fleet.boxes import boxssh, deploy_support
from fleet.boxes.deploy_support import peers_text
from fleet.boxes.inventory import Built
from fleet.cli import mesh_cmd
from fleet.core import config
from fleet.core.boxes import Row
from fleet.core.errors import ConfigError
from fleet.core.verdicts import Health
from fleet.ops import check, ports

EXAMPLE = ROOT / "examples" / "devnet.toml"

ROLE = """
[roles.{name}]
kind = "{kind}"
image = "img"
disk_gb = 20
programs = {programs}
{port}
admitted_driver = "580.95.05"
"""


def role(name: str, programs: str = '["node"]', kind: str = "standing",
         port: str = "p2p_port = 26611") -> str:
    return ROLE.format(name=name, programs=programs, kind=kind, port=port)


DEVNET = (role("dn2-seed") + role("dn2-miner", '["node", "miner"]')
          + role("dn2-prover", '["node", "prover"]') + role("solo"))
NETWORK = '[networks.dn2]\nroles = ["dn2-seed", "dn2-miner", "dn2-prover"]\n'


def parse(text: str) -> config.Config:
    return config.parse(tomllib.loads(text), Path("/fleet/fleet.toml"))


def test_a_network_groups_roles_and_a_role_in_none_is_a_network_of_its_own() -> None:
    cfg = parse(DEVNET + NETWORK)
    assert {r: cfg.network_of(r) for r in cfg.roles} == {
        "dn2-seed": "dn2", "dn2-miner": "dn2", "dn2-prover": "dn2", "solo": "solo"}
    assert cfg.network_roles("dn2") == ("dn2-seed", "dn2-miner", "dn2-prover")
    assert cfg.network_roles("solo") == ("solo",)
    assert cfg.roles["dn2-miner"].programs == ("node", "miner")  # the duties of its boxes


@pytest.mark.parametrize(("text", "message"), [
    ('[networks.Dn2]\nroles = ["dn2-seed"]\n', "networks.Dn2: bad network name 'Dn2'"),
    ('[networks.dn2]\nroles = ["dn2-seed", "nope"]\n', "networks.dn2.roles: unknown role 'nope'"),
    (NETWORK + '[networks.dn3]\nroles = ["dn2-miner"]\n',
     "networks.dn3.roles: role 'dn2-miner' is already in network 'dn2'"),
    ('[networks.dn2]\nroles = ["dn2-seed", "dn2-seed"]\n',
     "networks.dn2.roles: role 'dn2-seed' is already in network 'dn2'"),
    ('[networks.dn2]\nroles = []\n', "networks.dn2.roles: a network needs at least one role"),
    ('[networks.dn2]\n', "networks.dn2: missing key 'roles'"),
    ('[networks.dn2]\nroles = ["dn2-seed"]\nseed = "x"\n', "networks.dn2: unknown key 'seed'"),
    ('[networks.dn2]\nroles = "dn2-seed"\n', "networks.dn2.roles: expected list, got str"),
    ('[networks.solo]\nroles = ["dn2-seed"]\n',
     "networks.solo: the name of role 'solo', which is not in it"),
    (role("one", kind="oneshot", programs="[]", port="") + '[networks.n]\nroles = ["one"]\n',
     "networks.n.roles: role 'one' must be standing, run the node and have a p2p_port"),
    (role("nonode", '["miner"]') + '[networks.n]\nroles = ["nonode"]\n',
     "networks.n.roles: role 'nonode' must be standing, run the node and have a p2p_port"),
    (role("noport", port="") + '[networks.n]\nroles = ["noport"]\n',
     "networks.n.roles: role 'noport' must be standing, run the node and have a p2p_port"),
])
def test_a_network_mistake_is_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(DEVNET + text)
    assert str(e.value).startswith("/fleet/fleet.toml: ") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_fleet_without_networks_means_what_it_meant(tmp_path: Path) -> None:
    cfg = config.load(ROOT / "fleet.toml")
    assert cfg.networks == {}
    assert {r: cfg.network_of(r) for r in cfg.roles} == {r: r for r in cfg.roles}


def test_the_readme_shows_the_devnet_example_and_it_loads() -> None:
    text = EXAMPLE.read_text()
    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert text in blocks
    cfg = config.load(EXAMPLE)
    assert cfg.networks == {"dn2": ("dn2-seed", "dn2-miner", "dn2-prover")}
    duties = {r.name: r.programs for r in cfg.roles.values()}
    assert duties == {"dn2-seed": ("node",), "dn2-miner": ("node", "miner"),
                      "dn2-prover": ("node", "prover")}
    assert {w.role: w.count for w in cfg.roster} == {"dn2-seed": 1, "dn2-miner": 3,
                                                     "dn2-prover": 2}


def host(role: str, n: int, network: str, port: int | None = None) -> tuple[str, dict[str, Any]]:
    return (f"{role}-{n}", {"role": role, "network": network, "public_ip": f"10.77.1.{n}",
                            "p2p_public_port": port if port is not None else 40000 + n,
                            "provider": "vast", "p2p_port": 26611,
                            "standing_since": "2026-01-01T00:00:00Z"})


DEVNET_HOSTS = [host("dn2-seed", 1, "dn2"), host("dn2-miner", 2, "dn2"),
                host("dn2-miner", 3, "dn2"), host("dn2-prover", 4, "dn2", port=0),
                host("solo", 5, "solo"), host("solo", 6, "solo")]


def test_a_peers_file_names_the_other_boxes_of_its_network_whatever_their_role() -> None:
    assert peers_text("dn2-seed-1", DEVNET_HOSTS) == "10.77.1.2:40002\n10.77.1.3:40003\n"
    assert peers_text("dn2-prover-4", DEVNET_HOSTS) == \
        "10.77.1.1:40001\n10.77.1.2:40002\n10.77.1.3:40003\n"
    assert peers_text("solo-5", DEVNET_HOSTS) == "10.77.1.6:40006\n"
    mesh = deploy_support.Mesh(DEVNET_HOSTS)  # the run's endpoints, computed once for every host
    assert [mesh.text(name) for name, _ in DEVNET_HOSTS] == \
        [peers_text(name, DEVNET_HOSTS) for name, _ in DEVNET_HOSTS]


def checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, peers_in: dict[str, int],
            peers_out: int = 1) -> list[Health]:
    """`fleet check` over DEVNET_HOSTS, each node reporting `peers_in[label]` inbound."""
    cfg = F.config(tmp_path)
    cfg.registry.parent.mkdir(parents=True)

    def read(data: dict[str, Any], *_: Any) -> boxssh.FactRead:
        name = next(n for n, d in DEVNET_HOSTS if d is data)
        s = status()
        s["node"]["rpc"].update(peers_in=peers_in[name], peers_out=peers_out)
        return boxssh.FactRead(value=s, answered=True)
    monkeypatch.setattr(boxssh, "read_fact", read)
    return check.check(cfg, Built(groups={"standing": DEVNET_HOSTS}))


def test_the_star_only_rule_counts_the_network_s_mates(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    # the seed is dialled by one box of four in its network: fewer than the two it needs,
    # though it is the only box of its role
    ins = {"dn2-seed-1": 1, "dn2-miner-2": 2, "dn2-miner-3": 2, "dn2-prover-4": 2,
           "solo-5": 1, "solo-6": 1}
    star = {h.label: h.star_only for h in checked(monkeypatch, tmp_path, ins)}
    assert star == {"dn2-seed-1": True, "dn2-miner-2": False, "dn2-miner-3": False,
                    "dn2-prover-4": False, "solo-5": False, "solo-6": False}


def test_a_mapping_no_network_mate_dials_is_owed_a_port(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    ins = {"dn2-seed-1": 0, "dn2-miner-2": 2, "dn2-miner-3": 2, "dn2-prover-4": 2,
           "solo-5": 1, "solo-6": 1}
    owed = {h.label: h.port_owed for h in checked(monkeypatch, tmp_path, ins)}
    assert owed["dn2-seed-1"] == ("its mapping 10.77.1.1:40001 is dialled by none of its 3 "
                                  "mates, while 3 of them dial others")
    assert owed["dn2-prover-4"] is not None and owed["dn2-prover-4"].startswith(
        "no mapped p2p port")
    assert [k for k, v in owed.items() if v] == ["dn2-seed-1", "dn2-prover-4"]
    assert ports.owed(DEVNET_HOSTS[4][1], Health("solo-5", "vast", ssh=True), [], True) is None


def row(label: str, n: int) -> Row:
    return Row(label=label, provider="vast", role=label.rsplit("-", 1)[0], kind="standing",
               card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="running",
               public_ip=f"10.77.1.{n}", p2p_public_port=40000 + n)


def test_fleet_mesh_groups_and_counts_by_network() -> None:
    cfg = parse(DEVNET + NETWORK)
    rows = [row(name, i + 1) for i, (name, _) in enumerate(DEVNET_HOSTS)]
    results = [Health("dn2-seed-1", "vast", peers_in=1, star_only=True),
               Health("dn2-miner-2", "vast", peers_in=2, star_only=False),
               Health("dn2-miner-3", "vast", peers_in=3, star_only=False),
               Health("dn2-prover-4", "vast", peers_in=0, star_only=True),
               Health("solo-5", "vast", peers_in=1, star_only=False),
               Health("solo-6", "vast")]
    data = mesh_cmd.mesh_data(results, rows, cfg)
    assert [b["network"] for b in data["boxes"]] == ["dn2"] * 4 + ["solo"] * 2
    nets = data["networks"]
    assert list(nets) == ["dn2", "solo"]
    assert nets["dn2"]["roles"] == ["dn2-seed", "dn2-miner", "dn2-prover"]
    assert (nets["dn2"]["known"], nets["dn2"]["dialable"], nets["dn2"]["star_only"]) == \
        (4, 3, ["dn2-prover-4", "dn2-seed-1"])
    assert nets["solo"]["in_degrees"] == {"1": 1, "unknown": 1}
    lines = mesh_cmd.summary_lines(data)
    assert lines == [
        "network dn2 (dn2-seed, dn2-miner, dn2-prover): 3 of 4 nodes dialled by a peer; "
        "in-degrees: 1 with 0 in, 1 with 1 in, 1 with 2 in, 1 with 3 in; star-only: "
        "dn2-prover-4, dn2-seed-1; owed a port: none",
        "network solo: 1 of 1 nodes dialled by a peer; in-degrees: 1 with 1 in, 1 with "
        "unknown in; star-only: none; owed a port: none"]


LOOP_TOML = """
[fleet]
registry = "{tmp}/state/boxes.json"
ssh_key = "{tmp}/state/ssh/fleet"
daily_budget_usd = 100
"""


def test_the_loop_rewrites_the_peers_files_of_the_whole_network_when_its_set_changes(
        tmp_path: Path) -> None:
    from loop_fixture import FakeVast
    from test_loop_peers import box

    from fleet.ops.loop import Loop

    cfg = parse(LOOP_TOML.format(tmp=tmp_path) + DEVNET + NETWORK)
    cfg.ssh_key.parent.mkdir(parents=True)
    cfg.ssh_key.write_text("a key\n")
    vast = FakeVast()
    written: list[list[str]] = []

    def peers(_cfg: Any, labels: list[str]) -> None:
        written.append(labels)

    def healthy(_cfg: Any, built: Any) -> list[Health]:
        return [Health(label, "vast", ssh=True, agent=True)
                for label, _ in built.groups["standing"]]

    lp = Loop(cfg, {"vast": vast}, echo=lambda _: None, check_fn=healthy, peers_fn=peers,
              converge_fn=lambda _c, labels: None)
    seed, miner = box(lp, vast, 1, 40001, "dn2-seed"), box(lp, vast, 2, 40002, "dn2-miner")
    solo = box(lp, vast, 3, 40003, "solo")
    t = lp.tick()
    assert written == [[miner.label, seed.label], [solo.label]]
    assert "peers files of network dn2 rewritten on 2 boxes (2 dialable endpoints)" in t.actions
    assert "peers files of role solo rewritten on 1 boxes (1 dialable endpoints)" in t.actions
    prover = box(lp, vast, 4, 40004, "dn2-prover")  # a prover joins: every dn2 file names it
    lp.tick()
    assert written[2:] == [[miner.label, prover.label, seed.label]]
    assert lp.tick().actions == [] and len(written) == 3


def test_the_page_summarises_the_mesh_of_each_network(tmp_path: Path) -> None:
    from datetime import timedelta

    from fleet import page

    cfg = parse(LOOP_TOML.format(tmp=tmp_path) + DEVNET + NETWORK)
    standing = {"kind": "standing", "standing": True}
    rows = [F.row(label, 0.3, timedelta(hours=2), role=label.rsplit("-", 2)[0], **standing)
            for label in ("dn2-seed-vast-1", "dn2-miner-vast-2", "dn2-prover-vast-3",
                          "solo-vast-4")]
    health = [Health("dn2-seed-vast-1", "vast", ssh=True, agent=True, peers_in=1,
                     star_only=True, problems=["node: star-only"]),
              Health("dn2-miner-vast-2", "vast", ssh=True, agent=True, peers_in=2,
                     star_only=False, problems=["x"]),
              Health("dn2-prover-vast-3", "vast", ssh=True, agent=True, peers_in=2,
                     star_only=False, problems=["x"]),
              Health("solo-vast-4", "vast", problems=["ssh: box did not answer"])]
    d = page.build(page.PageInputs(cfg, rows, health, [], F.NOW))
    nets = d["mesh"]["networks"]
    assert [(n["network"], n["roles"], n["boxes"], n["known"], n["dialable"], n["star_only"])
            for n in nets] == [
        ("dn2", ["dn2-seed", "dn2-miner", "dn2-prover"], 3, 3, 3, ["dn2-seed-vast-1"]),
        ("solo", ["solo"], 1, 0, 0, [])]
    page.write(tmp_path, d)
    html = (tmp_path / "index.html").read_text()
    assert "Mesh of dn2 (dn2-seed, dn2-miner, dn2-prover): 3 of 3 nodes dialled by a peer;" \
        in html
    assert "Mesh of solo: 0 of 0 nodes dialled by a peer (1 unknown);" in html


def test_a_box_is_judged_on_the_duties_its_role_carries() -> None:
    from fleet.ops.check import judge

    miner = {"provider": "vast", "programs": ["node", "miner"], "gpu_programs": ["miner"]}
    seed = {"provider": "vast", "programs": ["node"], "gpu_programs": []}
    no_prover = status(prover={"state": None}, programs={"node": {"state": "running"},
                                                         "miner": {"state": "running"}})
    assert judge("dn2-miner-1", miner, no_prover, None, None).problems == []
    refused = {**no_prover, "admission": {"admitted": False, "reason": "driver 575.0.0"}}
    assert judge("dn2-seed-1", seed, refused, None, None).problems == []  # no GPU duty
    assert judge("dn2-miner-1", miner, refused, None, None).problems == [
        "admission refused: driver 575.0.0"]
    # host data that does not say its duties is judged on all of them
    assert judge("a", {"provider": "vast"}, no_prover, None, None).problems == [
        "prover: absent"]


@pytest.mark.parametrize("miner", [
    {"state": "backoff", "reason": "exit 1", "failures": 4, "degraded": False},
    {"state": "stopped"},
    None,  # the agent runs no miner at all
])
def test_a_miner_box_whose_miner_is_not_running_is_not_well(miner: dict | None) -> None:
    from fleet.ops.check import judge

    programs = {"node": {"state": "running"}, **({"miner": miner} if miner else {})}
    duties = {"provider": "vast", "programs": ["node", "miner"], "gpu_programs": ["miner"]}
    problems = judge("dn2-miner-1", duties, status(prover={"state": None}, programs=programs),
                     None, None).problems
    assert problems and problems[0].startswith("miner: ")


def _standing_row(label: str, role_name: str, n: int) -> Any:
    from fleet.core.boxes import Row

    return Row(label=label, provider="vast", role=role_name, kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, status="running", provider_id=str(n),
               host_key="k", ssh_host="10.0.0.1", ssh_port=22, standing=True,
               public_ip=f"10.77.1.{n}", p2p_public_port=40000 + n)


def test_a_box_of_a_retired_role_named_like_a_network_stays_out_of_its_mesh(
        tmp_path: Path) -> None:
    from fleet.boxes.deploy_support import Mesh
    from fleet.boxes.inventory import host_data
    from fleet.providers.base import Box

    cfg = parse(LOOP_TOML.format(tmp=tmp_path) + DEVNET + NETWORK)  # network dn2, no role dn2
    rows = [_standing_row("dn2-seed-vast-1", "dn2-seed", 1),
            _standing_row("dn2-miner-vast-2", "dn2-miner", 2),
            _standing_row("dn2-vast-9", "dn2", 9)]  # a box of a role fleet.toml dropped
    hosts = [(r.label, host_data(cfg, r, Box("vast", r.provider_id, r.label, "RTX 4090", 1, 0.3,
                                             "running", ssh_host="10.0.0.1", ssh_port=22,
                                             public_ip=r.public_ip,
                                             p2p_public_port=r.p2p_public_port)))
             for r in rows]
    mesh = Mesh(hosts)
    assert mesh.text("dn2-seed-vast-1") == "10.77.1.2:40002\n"
    assert mesh.text("dn2-vast-9") == ""
    assert cfg.network_of("dn2") != "dn2"


def test_a_mesh_dissolved_and_formed_again_has_its_peers_files_written_again(
        tmp_path: Path) -> None:
    from loop_fixture import FakeVast
    from test_loop_peers import box

    from fleet.ops.loop import Loop

    plain = parse(LOOP_TOML.format(tmp=tmp_path) + DEVNET)  # each role its own mesh
    netted = parse(LOOP_TOML.format(tmp=tmp_path) + DEVNET + NETWORK)
    plain.ssh_key.parent.mkdir(parents=True)
    plain.ssh_key.write_text("a key\n")
    vast = FakeVast()
    written: list[list[str]] = []

    def loop(cfg: Any) -> Any:
        def healthy(_cfg: Any, built: Any) -> list[Health]:
            return [Health(label, "vast", ssh=True, agent=True)
                    for label, _ in built.groups["standing"]]
        return Loop(cfg, {"vast": vast}, echo=lambda _: None, check_fn=healthy,
                    peers_fn=lambda _c, labels: written.append(sorted(labels)),
                    converge_fn=lambda _c, labels: None)

    lp = loop(plain)
    seeds = [box(lp, vast, n, 40000 + n, "dn2-seed").label for n in (1, 2)]
    miners = [box(lp, vast, n, 40000 + n, "dn2-miner").label for n in (3, 4)]
    lp.tick()
    assert sorted(written) == [sorted(miners), sorted(seeds)]
    loop(netted).tick()  # the operator groups them into dn2: one mesh
    assert written[2:] == [sorted(seeds + miners)]
    loop(plain).tick()  # and takes the network out again: the seeds' files name the miners
    assert sorted(written[3:]) == [sorted(miners), sorted(seeds)]
