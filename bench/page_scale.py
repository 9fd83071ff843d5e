"""The fleet page built over a generated fleet of 1,000 and 10,000 live boxes, in-process.

    .venv/bin/python bench/page_scale.py [--sizes 1000 10000] [--rounds 3] [--smoke]

A generated fleet (no provider, no SSH): per size N, N live boxes (nine in ten standing, each
with an SSH endpoint, a public IP, a host key and a place; one in ten a one-shot box with its
job) and N / 5 destroyed rows that only draw the chart. Every standing box is checked well
(a healthy tick), every one-shot box watched well. Timed, as the loop's page hook runs them
after a tick: `page.build` (the data: scrubbing, verdicts, money, the chart) and
`page.render` (the HTML). The figures are the median round, printed as JSON; each size's page
is checked to hold no secret of the registry.

To compare with the code before a change, run the same command in a checkout of that commit.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _smoke

from fleet import page
from fleet.core.boxes import Row
from fleet.core.config import Config, Role, Want
from fleet.core.verdicts import Health, Watch

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
SHA = "4f1c2a9be07d3351"


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def config(n: int) -> Config:
    tmp = Path("/nonexistent")
    roles = {"live": Role("live", "standing", "img", 40),
             "bench": Role("bench", "oneshot", "img", 20)}
    return Config(path=tmp / "fleet.toml", registry=tmp / "boxes.json",
                  known_hosts=tmp / "known_hosts", ssh_key=tmp / "key", releases=tmp / "rel",
                  daily_budget_usd=100_000.0, roles=roles,
                  roster=(Want("live", "vast", "RTX 4090", 1, n // 2),
                          Want("live", "runpod", "RTX 4090", 1, n - n // 2)))


def fleet(n: int) -> tuple[list[Row], list[Health], list[Watch]]:
    rows: list[Row] = []
    health: list[Health] = []
    watched: list[Watch] = []
    for i in range(n + n // 5):
        provider = "vast" if i % 2 else "runpod"
        oneshot = i % 10 == 9
        role = "bench" if oneshot else "live"
        label = f"{role}-{provider}-{i:06d}"
        gone = i >= n
        a, b, c = i // 65536, i // 256 % 256, i % 256
        rows.append(Row(
            label=label, provider=provider, role=role,
            kind="oneshot" if oneshot else "standing", card="RTX 4090", gpu_count=1,
            usd_per_hour=0.3 + (i % 7) / 100, status="destroyed" if gone else "running",
            provider_id=str(100000 + i), ssh_host=f"10.{a}.{b}.{c}", ssh_port=20000 + i % 40000,
            public_ip=f"100.{64 + a}.{b}.{c}",
            host_key=f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{i:024d}",
            standing=not oneshot, created_at=_iso(NOW - timedelta(hours=1 + i % 150)),
            destroyed_at=_iso(NOW - timedelta(minutes=i % 50)) if gone else None,
            place=f"{provider} machine {i // 3}", node_sha16_wanted=None if oneshot else SHA,
            job="fma" if oneshot else None, job_state="running" if oneshot else None,
            expires_at=_iso(NOW + timedelta(hours=1)) if oneshot else None))
        if gone:
            continue
        if oneshot:
            watched.append(Watch(label, "fma", "running", 20.0, 40.0))
        else:
            health.append(Health(label, provider, ssh=True, agent=True, synced=True,
                                 blocks=1000 + i, admitted=True, node_sha16=SHA,
                                 wanted_sha16=SHA, peers_in=3, peers_out=3, star_only=False,
                                 disk_free=80 * 2**30, disk_total=100 * 2**30))
    return rows, health, watched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    args = _smoke.parse(ap, sizes=[100, 1000], rounds=1)

    out: dict[str, Any] = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "python": platform.python_version(), "rounds": args.rounds,
                           "sizes": []}
    for n in args.sizes:
        cfg = config(n)
        rows, health, watched = fleet(n)
        times: dict[str, list[float]] = {"build": [], "render": []}
        for _ in range(args.rounds):
            t = time.perf_counter()
            data = page.build(page.PageInputs(cfg, rows, health, watched, NOW, billed={}))
            times["build"].append(time.perf_counter() - t)
            t = time.perf_counter()
            html = page.render(data)
            times["render"].append(time.perf_counter() - t)
        assert data["totals"]["boxes"] == n, data["totals"]
        assert data["totals"]["verdicts"]["well"] == n, data["totals"]["verdicts"]
        text = json.dumps(data) + html
        for r in rows[:: max(1, len(rows) // 200)]:  # a sample: the page carries none of them
            assert r.host_key is not None and r.public_ip is not None
            for secret in (f"{r.ssh_host}:{r.ssh_port}", r.public_ip, r.host_key.split()[1]):
                assert secret not in text, secret
        out["sizes"].append({"live_boxes": n, "destroyed_rows": n // 5,
                             "build_s": round(statistics.median(times["build"]), 3),
                             "render_s": round(statistics.median(times["render"]), 3)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
