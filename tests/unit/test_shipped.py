"""An installed fleet (a wheel, not a checkout) carries what its commands run: the deploys and
the inventory pyinfra is given, the testinfra checks `fleet converge` runs after a deploy, the
box's scripts and the agent's code the bundle packs, and the templates."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from repo_root import ROOT

WHERE = textwrap.dedent("""
    import json
    from fleet.boxes import bundle, pyinfra_run
    from fleet.core import paths
    from fleet.ops import converge
    print(json.dumps({
        "deploy": pyinfra_run.argv("deploys/standing.py", ["standing"])[-2:],
        "checks": converge.checks_argv()[-1],
        "checks_files": sorted(p.name for p in paths.CHECKS.glob("*.py")),
        "box_files": sorted(p.name for p in paths.BOX_FILES.iterdir()),
        "agent": str(bundle.AGENT_CODE),
        "contract": (bundle.AGENT_CODE / "contract.py").is_file(),
        "templates": [(paths.SHIPPED.parent / t).is_file() for t in
                      ("page/templates/index.html.j2", "page/templates/page.css",
                       "boxes/templates/agent.toml.j2")],
    }))
""")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp / "dist").glob("fleet-*.whl")
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    return site


def _in(site: Path, *args: str, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd or site.parent,
                          env={**os.environ, **(env or {}), "PYTHONPATH": str(site)})


def test_an_installed_fleet_runs_its_own_deploys_and_checks(installed: Path) -> None:
    r = _in(installed, "-c", WHERE)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    shipped = installed / "fleet" / "shipped"
    assert got["deploy"] == [str(shipped / "inventory.py"),
                             str(shipped / "deploys" / "standing.py")]
    assert all(Path(p).is_file() for p in got["deploy"])
    assert got["checks"] == str(shipped / "checks")
    assert {"conftest.py", "test_standing.py", "test_oneshot.py",
            "test_publish.py"} <= set(got["checks_files"])
    assert got["box_files"] == sorted(p.name for p in (ROOT / "in").iterdir())
    assert got["agent"] == str(installed / "agent") and got["contract"]
    assert got["templates"] == [True, True, True]


def test_the_installed_checks_are_collected_against_the_inventory_given(installed: Path,
                                                                        tmp_path: Path) -> None:
    """`fleet converge` runs the shipped checks with FLEET_INVENTORY naming the inventory; far
    from any checkout they still collect (no test is run here: no box is up)."""
    stub = tmp_path / "inventory.py"
    stub.write_text('standing = [("live-000000-vast-000001", {"ssh_hostname": "10.0.0.1", '
                    '"ssh_port": 22})]\noneshot = []\n')
    checks = installed / "fleet" / "shipped" / "checks"
    r = _in(installed, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
            str(checks), env={"FLEET_INVENTORY": str(stub)}, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    collected = [ln for ln in r.stdout.splitlines() if "::" in ln]
    assert collected and all("site/fleet/shipped/checks/test_" in ln for ln in collected)
    assert any("test_standing.py::" in ln for ln in collected), r.stdout
