"""A small fleet for the page's tests: rows, verdicts and an owed box, at a fixed time.

Every row carries an SSH endpoint, a public IP and a host key that must never reach the page;
one problem text names an address the registry does not know, to prove the scrubbing of free
text.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from fleet.core.boxes import Row
from fleet.core.config import Config, Role, Want
from fleet.core.verdicts import Health, Owed, Watch

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
WANTED = "4f1c2a9be07d3351"
OLD = "0b7e61c4d2a9f813"
STRAY_IP = "192.0.2.201"  # in a problem text only, never in the registry
SECRETS = {  # label -> (ssh_host, ssh_port, public_ip, host_key)
    "live-vast-a1": ("203.0.113.7", 47913, "198.51.100.23",
                     "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPageTestHostKeyAlpha0000000000001"),
    "live-runpod-b2": ("ssh.runpod.example", 41877, "198.51.100.24",
                       "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPageTestHostKeyBravo0000000000002"),
    "live-vast-c3": ("203.0.113.8", 43051, "2001:db8::17",
                     "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPageTestHostKeyCharlie00000000003"),
    "bench-vast-e5": ("203.0.113.9", 45519, "198.51.100.25",
                      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPageTestHostKeyDelta0000000000004"),
    "bench-runpod-f6": ("ssh2.runpod.example", 46661, "198.51.100.26",
                        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPageTestHostKeyEcho00000000000005"),
}


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def config(tmp: Path = Path("/nonexistent")) -> Config:
    roles = {"live": Role("live", "standing", "img", 40), "bench": Role("bench", "oneshot",
                                                                         "img", 20)}
    return Config(path=tmp / "fleet.toml", registry=tmp / "state" / "boxes.json",
                  known_hosts=tmp / "known_hosts", ssh_key=tmp / "key", releases=tmp / "rel",
                  daily_budget_usd=60.0, roles=roles,
                  roster=(Want("live", "vast", "RTX 4090", 1, 2),
                          Want("live", "runpod", "RTX 4090", 1, 2)))


def row(label: str, usd: float, created: timedelta, destroyed: timedelta | None = None,
        **kw: object) -> Row:
    role = label.split("-")[0]
    host, port, ip, key = SECRETS.get(label, (None, None, None, None))
    base: dict[str, object] = dict(
        label=label, provider=label.split("-")[1], role=role,
        kind="standing" if role == "live" else "oneshot", card="RTX 4090", gpu_count=1,
        usd_per_hour=usd, status="destroyed" if destroyed else "running",
        provider_id=f"id-{label}", ssh_host=host, ssh_port=port, public_ip=ip, host_key=key,
        standing=role == "live", created_at=iso(NOW - created),
        destroyed_at=iso(NOW - destroyed) if destroyed else None,
        node_sha16_wanted=WANTED if role == "live" else None)
    base.update(kw)
    return Row(**base)  # type: ignore[arg-type]


def rows() -> list[Row]:
    return [
        row("live-vast-a1", 0.412, timedelta(days=3, hours=5), place="vast machine 10697"),
        row("live-runpod-b2", 0.39, timedelta(hours=26), place="runpod data center EU-RO-1"),
        row("live-vast-c3", 0.405, timedelta(days=2), status="exited",
            place="vast machine 10697", note="shares vast machine 10697 with live-vast-a1"),
        row("bench-vast-e5", 0.6, timedelta(minutes=20), job="fma",
            expires_at=iso(NOW + timedelta(minutes=40)), job_state="running"),
        row("bench-runpod-f6", 0.74, timedelta(hours=2), gpu_count=2, card="RTX 5090",
            job="gemm-sweep", expires_at=iso(NOW - timedelta(minutes=15)),
            job_state="finished"),
        # history: destroyed and failed rows are not listed, but they drew the chart
        row("live-vast-old", 0.45, timedelta(days=6), timedelta(days=2, hours=1)),
        row("bench-vast-old", 1.2, timedelta(days=4), timedelta(days=3, hours=22)),
        row("live-runpod-gone", 0.5, timedelta(days=9), timedelta(days=8)),
        row("bench-vast-fail", 9.0, timedelta(days=1), timedelta(hours=23), status="failed"),
    ]


def health() -> list[Health]:
    return [
        Health("live-vast-a1", "vast", ssh=True, agent=True, synced=True, blocks=1_284_311,
               exec_tip=1_284_309, exec_moving=True, prover="proving", admitted=True,
               node_sha16=WANTED, wanted_sha16=WANTED, peers_in=2, peers_out=1,
               star_only=False),
        Health("live-runpod-b2", "runpod", ssh=True, agent=True, synced=True, blocks=1_284_305,
               exec_tip=1_284_300, exec_moving=True, prover="proving", admitted=True,
               node_sha16=OLD, wanted_sha16=WANTED, peers_in=0, peers_out=2, star_only=True,
               problems=[f"node: behind: runs 1.3.0 ({OLD}), wanted 1.4.0 ({WANTED})"]),
        Health("live-vast-c3", "vast", problems=["provider: box is exited"]),
    ]


def watched() -> list[Watch]:
    return [
        Watch("bench-vast-e5", "fma", "running", 20.0, 40.0),
        Watch("bench-runpod-f6", "gemm-sweep", "finished", 120.0, -15.0, problems=[
            "past its deadline by 15 min; the meter is running",
            "job finished, box still billing: fleet teardown bench-runpod-f6",
            f"job state unknown: ssh to {STRAY_IP}:22 and 203.0.113.9:45519 timed out"]),
    ]


def owed() -> list[Owed]:
    return [Owed("live", "runpod", "RTX 4090", 1,
                 reason="no capacity: tried 3 of 3 RTX 4090 offers on runpod; retrying every tick",
                 since=iso(NOW - timedelta(minutes=95)))]
