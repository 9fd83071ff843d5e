"""The one-shot job file: what it accepts, and one clear line for every mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.core.config import Role
from fleet.core.errors import UsageError
from fleet.core.job import load

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GOOD = f"""
name = "fma-bench"
command = "python3 run.py"
outputs = "out"
ttl_minutes = 30
modules = ["toolchain/kernels/*.ptx"]
inputs = "inputs"
[toolchain]
repo = "fleet/toolchains"
revision = "{COMMIT}"
[[gates]]
name = "parity"
command = "python3 parity.py"
min_passed = 4
"""


def write(tmp: Path, text: str) -> Path:
    (tmp / "inputs").mkdir(exist_ok=True)
    p = tmp / "job.toml"
    p.write_text(text)
    return p


def test_a_good_job_file_and_what_the_box_is_given(tmp_path: Path) -> None:
    job = load(write(tmp_path, GOOD))
    assert job.name == "fma-bench" and job.ttl_minutes == 30 and job.gpus == 1
    assert job.toolchain is not None and job.toolchain.path == "toolchain"
    assert job.gates[0].min_passed == 4 and job.inputs == (tmp_path / "inputs").resolve()
    role = Role("bench", "oneshot", "img", 20, admitted_driver="580.95.05",
                qualified_gpus=("GPU-1",), banned_symbols=("cublas*",))
    spec = job.box_spec(role, "http://store:1")
    assert spec["admission"] == {"driver": "580.95.05", "qualified_gpus": ["GPU-1"],
                                 "banned_symbols": ["cublas*"], "allowed_symbols": []}
    assert spec["toolchain"]["revision"] == COMMIT and spec["store_endpoint"] == "http://store:1"
    assert "token" not in str(spec).lower()


@pytest.mark.parametrize(("change", "says"), [
    (("ttl_minutes = 30", "ttl_minutes = 30\ncolour = 1"), "unknown key 'colour'"),
    (('command = "python3 run.py"\n', ""), "missing key 'command'"),
    ((COMMIT, "main"), "'main' is not a commit"),
    ((COMMIT, COMMIT[:12]), "is not a commit"),
    (('outputs = "out"', 'outputs = "../out"'), "must be a path inside the work directory"),
    (('outputs = "out"', 'outputs = "/tmp/out"'), "must be a path inside the work directory"),
    (("ttl_minutes = 30", "ttl_minutes = 0"), "ttl_minutes must be 1 to"),
    (("ttl_minutes = 30", 'ttl_minutes = "30"'), "ttl_minutes: expected int, got str"),
    (('name = "fma-bench"', 'name = "Bench Job"'), "lowercase letters"),
    (("min_passed = 4", "min_passed = -1"), "min_passed: must be 1 or more"),
    (("min_passed = 4", "min_passed = 0"), "min_passed: must be 1 or more"),
    (('command = "python3 parity.py"', 'command = " "'), "gates[0].command: is empty"),
    (('name = "parity"', 'name = ""'), "gates[0].name: is empty"),
    (('outputs = "out"', 'outputs = "out "'), "must be a path inside the work directory"),
    (('["toolchain/kernels/*.ptx"]', '["toolchain/kernels/*.ptx "]'),
     "must be a path inside the work directory"),
    (('repo = "fleet/toolchains"', 'repo = "fleet/-toolchains"'), "is not a repository id"),
    ((COMMIT, COMMIT + "\\n"), "is not a commit"),
    (('inputs = "inputs"', 'inputs = "nowhere"'), "is not a folder"),
    (('repo = "fleet/toolchains"', 'repo = "toolchains"'), "is not a repository id"),
    (("ttl_minutes = 30", "ttl_minutes = 30\nprovider = \"aws\""), "provider: expected one of"),
    (("min_passed = 4", "min_passed = 4\n[[gates]]\nname = \"parity\"\ncommand = \"x\""),
     "two gates share a name"),
    (('command = "python3 parity.py"', 'command = "python3 parity.py || true"'),
     "gates[0].command 'python3 parity.py || true' cannot be read strictly: '||'"),
    (('command = "python3 parity.py"', 'command = "s\\\\et +e; python3 parity.py"'),
     "cannot be read strictly: 'set' re-enters a shell"),
    (('command = "python3 parity.py"', 'command = "sh -c \'python3 parity.py\'"'),
     "cannot be read strictly: 'sh' re-enters a shell"),
])
def test_every_mistake_is_one_line(tmp_path: Path, change: tuple[str, str], says: str) -> None:
    assert change[0] in GOOD
    with pytest.raises(UsageError) as e:
        load(write(tmp_path, GOOD.replace(change[0], change[1], 1)))
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert str(tmp_path / "job.toml") in str(e.value)


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not valid TOML"):
        load(write(tmp_path, "name = "))
    with pytest.raises(UsageError, match="no such job file"):
        load(tmp_path / "absent.toml")


def test_a_job_card_in_any_spelling_is_the_fleet_name_and_an_unknown_one_is_one_line(
        tmp_path: Path) -> None:
    job = load(write(tmp_path, GOOD.replace('ttl_minutes = 30',
                                            'ttl_minutes = 30\ncard = "nvidia geforce rtx 4090"')))
    assert job.card == "RTX 4090"
    with pytest.raises(UsageError, match=r"card: unknown card 'RTX 9999'"):
        load(write(tmp_path, GOOD.replace('ttl_minutes = 30',
                                          'ttl_minutes = 30\ncard = "RTX 9999"')))


def test_a_gate_wants_one_passed_test_unless_it_says_more(tmp_path: Path) -> None:
    job = load(write(tmp_path, GOOD.replace("min_passed = 4\n", "")))
    assert job.gates[0].min_passed == 1


def test_where_the_role_bans_symbols_the_job_names_its_modules(tmp_path: Path) -> None:
    role = Role("bench", "oneshot", "img", 20, admitted_driver="580.95.05",
                banned_symbols=("cublas*",))
    bare = load(write(tmp_path, GOOD.replace('modules = ["toolchain/kernels/*.ptx"]\n', "")))
    with pytest.raises(UsageError, match="bans symbols .cublas... so the job must name its "
                                         "compiled modules"):
        bare.box_spec(role, None)
    bare.check_role(Role("free", "oneshot", "img", 20, admitted_driver="580.95.05"))
    with pytest.raises(UsageError, match="names no admitted_driver"):
        bare.check_role(Role("free", "oneshot", "img", 20))
    load(write(tmp_path, GOOD)).check_role(role)


BARE = """
name = "fma-bench"
command = "python3 run.py"
outputs = "out"
ttl_minutes = 30
inputs = "inputs"
"""
ROLE = Role("bench", "oneshot", "img", 20, admitted_driver="580.95.05")


@pytest.mark.parametrize(("text", "files", "says"), [
    # the agent's fetch refuses to hide the job's own files under the toolchain's link
    (GOOD, {"toolchain/kernels/k.ptx": "x"},
     "workdir/toolchain exists in the job's inputs; the toolchain would hide it"),
    (GOOD.replace('revision = "', 'path = "tc/kit"\nrevision = "'), {"tc": "a file"},
     "workdir/tc in the job's inputs is not a folder"),
    # the agent's scan refuses a module glob that matches nothing
    (BARE + 'modules = ["kernels/*.cubin"]\n', {"kernels/k.ptx": "x"},
     "module glob 'kernels/*.cubin' matched nothing"),
    (GOOD.replace('["toolchain/kernels/*.ptx"]', '["toolchain/kernels/*.ptx", "k/*.ptx"]'), {},
     "module glob 'k/*.ptx' matched nothing"),
    # the agent's run could not make the outputs folder
    (BARE, {"out": "a file"}, "workdir/out exists in the job's inputs and is not a folder"),
    (BARE.replace('outputs = "out"', 'outputs = "res/out"'), {"res": "a file"},
     "workdir/res in the job's inputs is not a folder"),
])
def test_inputs_the_agent_would_refuse_rent_nothing(tmp_path: Path, text: str,
                                                    files: dict[str, str], says: str) -> None:
    job = load(write(tmp_path, text))
    for rel, data in files.items():
        (tmp_path / "inputs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "inputs" / rel).write_text(data)
    with pytest.raises(UsageError) as e:
        job.box_spec(ROLE, "http://store:1")
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert str(tmp_path / "job.toml") in str(e.value)


def test_inputs_the_agent_takes_pass(tmp_path: Path) -> None:
    job = load(write(tmp_path, BARE + 'modules = ["kernels/*.ptx"]\n'))
    (tmp_path / "inputs" / "kernels").mkdir()
    (tmp_path / "inputs" / "kernels" / "k.ptx").write_text("x")
    (tmp_path / "inputs" / "out").mkdir()  # an outputs folder already there is used as it is
    assert job.box_spec(ROLE, None)["modules"] == ["kernels/*.ptx"]
    # a glob that may match inside the toolchain is left to the box's scan
    load(write(tmp_path, GOOD)).box_spec(ROLE, "http://store:1")


@pytest.mark.parametrize("linked", ["file", "folder"])
def test_a_module_reached_only_through_a_link_rents_nothing(tmp_path: Path, linked: str) -> None:
    """The upload sends regular files alone (no link, nothing under a linked folder): the
    checks read that same set, so a module the box would never receive is refused here."""
    job = load(write(tmp_path, BARE + 'modules = ["kernels/*.ptx"]\n'))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "k.ptx").write_text("x")
    if linked == "file":
        (tmp_path / "inputs" / "kernels").mkdir(parents=True)
        (tmp_path / "inputs" / "kernels" / "k.ptx").symlink_to(tmp_path / "elsewhere" / "k.ptx")
    else:
        (tmp_path / "inputs").mkdir(exist_ok=True)
        (tmp_path / "inputs" / "kernels").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UsageError) as e:
        job.box_spec(ROLE, None)
    assert "module glob 'kernels/*.ptx' matched nothing" in str(e.value)


def test_a_job_that_names_an_amd_card_rents_nothing(tmp_path: Path) -> None:
    job = load(write(tmp_path, GOOD.replace('ttl_minutes = 30',
                                            'ttl_minutes = 30\ncard = "Instinct MI300X"')))
    assert job.card == "MI300X"
    role = Role("bench", "oneshot", "img", 20, admitted_driver="580.95.05")
    with pytest.raises(UsageError, match=r"card: MI300X is not an NVIDIA card; one-shot jobs "
                                         "run on NVIDIA cards only"):
        job.check_role(role)
