"""The agent bundle: wheels for the box's platform, a cache keyed by name, version and
platform, and one deterministic tarball builder for every deploy (no network here: pip is
replaced by a stand-in that writes wheel files)."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from repo_root import ROOT

from fleet.boxes import bundle
from fleet.core.errors import FleetError

PSUTIL = "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl"  # noqa: E501
NVML = "nvidia_ml_py-13.615.71-py3-none-any.whl"
AMDSMI = "amdsmi-7.0.2-py3-none-any.whl"
STALE = "psutil-7.1.0-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl"  # noqa: E501
MAC = "psutil-7.2.2-cp36-abi3-macosx_11_0_arm64.whl"
# the one-shot job's wheels: pyelftools, huggingface_hub and what it needs at run time
JOB_WHEELS = (
    "pyelftools-0.33-py3-none-any.whl", "huggingface_hub-2.4.0-py3-none-any.whl",
    "httpx2-2.16.2-py3-none-any.whl", "httpcore2-2.16.2-py3-none-any.whl",
    "h11-0.16.0-py3-none-any.whl", "idna-3.20-py3-none-any.whl",
    "truststore-0.10.5-py3-none-any.whl", "filelock-4.3.1-py3-none-any.whl",
    "tqdm-4.70.1-py3-none-any.whl",
    "pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",  # noqa: E501
    "typing_extensions-4.16.0-py3-none-any.whl",
)


def touch(dest: Path, *names: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        (dest / name).write_bytes(b"wheel " + name.encode())


class FakePip:
    """Stands in for `pip download`: records the command, writes the box's wheels."""

    def __init__(self, writes: tuple[str, ...] = (PSUTIL, NVML, AMDSMI, *JOB_WHEELS),
                 rc: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.writes, self.rc = writes, rc

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(cmd))
        if self.rc:
            return subprocess.CompletedProcess(cmd, self.rc, "", "Collecting psutil\n"
                                               "ERROR: No matching distribution found\n")
        touch(Path(cmd[cmd.index("-d") + 1]), *self.writes)
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def pip(monkeypatch: pytest.MonkeyPatch) -> FakePip:
    fake = FakePip()
    monkeypatch.setattr(bundle.subprocess, "run", fake)
    return fake


def names(paths: list[Path]) -> list[str]:
    return sorted(p.name for p in paths)


# ---------------------------------------------------------------- the wheel cache

def test_the_exact_pinned_wheels_for_the_box_are_a_cache_hit(tmp_path: Path, pip: FakePip) -> None:
    touch(tmp_path, PSUTIL, NVML, AMDSMI, *JOB_WHEELS)
    assert names(bundle._download_wheels(tmp_path)) == sorted([PSUTIL, NVML, AMDSMI, *JOB_WHEELS])
    assert pip.calls == []


def test_another_version_in_the_cache_is_stale(tmp_path: Path, pip: FakePip) -> None:
    touch(tmp_path, STALE, NVML, AMDSMI, *JOB_WHEELS)
    assert names(bundle._download_wheels(tmp_path)) == sorted([PSUTIL, NVML, AMDSMI, *JOB_WHEELS])
    assert len(pip.calls) == 1  # the pinned psutil was fetched, the stale one is not shipped
    assert (tmp_path / STALE).exists()


def test_a_wheel_for_another_platform_is_no_hit(tmp_path: Path, pip: FakePip) -> None:
    touch(tmp_path, MAC, NVML, AMDSMI, *JOB_WHEELS)
    assert names(bundle._download_wheels(tmp_path)) == sorted([PSUTIL, NVML, AMDSMI, *JOB_WHEELS])
    assert len(pip.calls) == 1


def test_pip_is_asked_for_the_box_platform_not_the_operators(tmp_path: Path,
                                                             pip: FakePip) -> None:
    bundle._download_wheels(tmp_path)
    (cmd,) = pip.calls
    assert cmd[1:4] == ["-m", "pip", "download"]

    def values(flag: str) -> list[str]:
        return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == flag]

    assert "manylinux_2_28_x86_64" in values("--platform")
    assert "manylinux2014_x86_64" in values("--platform")
    assert values("--python-version") == ["3.11"]
    assert values("--implementation") == ["cp"]
    assert values("--abi") == ["cp311"]
    assert "--only-binary=:all:" in cmd and "--no-deps" in cmd
    assert values("-d") == [str(tmp_path)]
    assert cmd[-len(bundle.AGENT_WHEELS):] == list(bundle.AGENT_WHEELS)


def test_the_pins_are_the_versions_the_tests_run_with() -> None:
    """What the box gets is what the job fetch and scan were tested with here."""
    from importlib.metadata import version

    for pin in bundle.AGENT_WHEELS:
        name, _, pinned = pin.partition("==")
        assert version(name) == pinned, pin
    left_out = {"hf-xet", "click", "fsspec", "packaging", "anyio"}  # see AGENT_WHEELS
    assert not left_out & {p.partition("==")[0].replace("_", "-") for p in bundle.AGENT_WHEELS}


def test_the_pins_agree_with_the_constraints_a_fresh_machine_installs() -> None:
    """run.sh installs the test environment under constraints.txt; the box gets the same."""
    from packaging.utils import canonicalize_name

    constraints = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            constraints[canonicalize_name(name)] = pinned
    for pin in bundle.AGENT_WHEELS:
        name, _, pinned = pin.partition("==")
        assert constraints.get(canonicalize_name(name)) == pinned, pin


def test_a_failing_pip_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle.subprocess, "run", FakePip(rc=1))
    with pytest.raises(FleetError) as e:
        bundle._download_wheels(tmp_path)
    assert str(e.value) == ("cannot fetch the agent's wheels: "
                            "ERROR: No matching distribution found")


def test_pip_leaving_the_wrong_wheel_is_an_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundle.subprocess, "run", FakePip(writes=(MAC, NVML, AMDSMI, *JOB_WHEELS)))
    with pytest.raises(FleetError, match="no psutil==7.2.2 wheel for the box"):
        bundle._download_wheels(tmp_path)


# ---------------------------------------------------------------- the bundle itself

def members(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return tar.getmembers()


def test_the_bundle_ships_only_the_pinned_wheels_and_is_deterministic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pip: FakePip) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    touch(bundle.wheel_cache(), PSUTIL, NVML, AMDSMI, STALE, MAC, *JOB_WHEELS)
    first = bundle.build(tmp_path / "cache")
    os.utime(bundle.wheel_cache() / PSUTIL, (1, 1))  # an mtime is no content
    second = bundle.build(tmp_path / "cache")
    assert first == second and pip.calls == []
    data = first.path.read_bytes()
    assert data[4:8] == b"\0\0\0\0"  # gzip header mtime
    infos = members(data)
    wheels = [i.name for i in infos if i.name.startswith("wheels/")]
    assert wheels == sorted(f"wheels/{w}" for w in (PSUTIL, NVML, AMDSMI, *JOB_WHEELS))
    assert not [w for w in wheels if "hf_xet" in w]  # the fetch runs with Xet disabled
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    assert "agent/__main__.py" in {i.name for i in infos}
    assert all(i.mtime == 0 and i.uid == 0 and i.uname == "root" for i in infos)
    assert {i.mode for i in infos if i.name.startswith("in/")} <= {0o755}
    with gzip.open(first.path) as raw:
        assert raw.read(1)  # a valid gzip stream
