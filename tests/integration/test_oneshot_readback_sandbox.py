"""What the teardown trusts, on a sandbox box: the operator's record of the job (its registry
row), never the files on the box (the job's code runs as its own user and cannot rewrite the
agent's). Real box, real deploy and agent, the real store; the box ends destroyed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from oneshot_box import OneShot, archive_copy, oneshot_sandbox, stored_outputs


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OneShot]:
    yield from oneshot_sandbox(tmp_path_factory)


# the job's last acts: it tries to make its spec file on the box (the agent's job.json) name
# another outputs folder, one it never made, and to make its state say it has finished
REWRITE = ("import json, pathlib; p = pathlib.Path('/root/fleet/jobs/respec/job.json'); "
           "s = json.loads(p.read_text()); s['outputs'] = 'logs'; p.write_text(json.dumps(s))")
FORGE = ("import json, pathlib; p = pathlib.Path('/root/fleet/jobs/respec/state.json'); "
         "s = json.loads(p.read_text()); s.update(phase='finished', exit_code=0); "
         "p.write_text(json.dumps(s))")


def test_a_job_cannot_rewrite_its_spec_file_and_is_read_back_from_the_folder_the_operator_named(
        fleet: OneShot) -> None:
    # the command exits 0 only when both writes fail: the job's user cannot reach the records
    command = json.dumps(f'python3 run.py && ! python3 -c "{REWRITE}" && '
                         f'! python3 -c "{FORGE}"')  # a TOML string
    rc, s = fleet.run_job("bench", fleet.job("respec", command=command))
    assert rc == 0 and s["verdict"] == "ran" and s["exit_code"] == 0, s  # the rewrite failed
    assert s["destroyed"] and not s["kept"], s
    row = fleet.rows()[s["label"]]
    assert row.outputs == "out" and row.read_back == "respec" and row.status == "destroyed"
    archived = archive_copy(fleet, row.label, "respec")
    assert set(archived) == {"results.json", "samples.bin"}, sorted(archived)
    assert s["outputs_files"] == len(archived)
    stored, _ = stored_outputs(fleet, s["store_commit"], f"respec/{row.label}")
    assert stored == archived
