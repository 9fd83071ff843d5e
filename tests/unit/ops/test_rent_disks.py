"""Where a rented box keeps the fleet's root: RunPod drops the container disk at every stop and
restart and keeps the pod's volume (shared/research/providers.md, "Disks"), so a RunPod box is
rented with a volume at the fleet's root and a start command that the pod keeps; a Vast box
keeps its one disk and runs its onstart."""

from __future__ import annotations

import json
import shlex

from cli_sandbox import FleetRun

from agent.contract import ROOT
from sandbox.backend import BoxSpec
from sandbox.world import Instance


def rented(fleet: FleetRun, provider: str) -> tuple[Instance, BoxSpec]:
    r = fleet("rent", "live", "--provider", provider, "--no-wait", "--json")
    assert r.code == 0, r.err
    (row,) = fleet.reg.live_rows()
    inst = fleet.sbx.world.get(provider, row.provider_id)
    assert inst is not None
    return inst, fleet.sbx.world.box_spec(inst)


def test_a_runpod_box_keeps_the_fleets_root_on_its_volume(fleet: FleetRun) -> None:
    inst, spec = rented(fleet, "runpod")
    assert inst.volume_gb == 20 and inst.extra["volumeMountPath"] == ROOT
    assert spec.volume_path == ROOT and spec.volume_gb == 20 and not spec.disk_kept
    docker_args = json.loads(inst.extra["dockerArgs"])
    assert docker_args["entrypoint"] == ["/bin/sh", "-c"]
    (cmd,) = docker_args["cmd"]
    # the host keys kept on the volume put back first, and only then the boot script from
    # the volume beside the image's own start script (which makes keys where none are, and sshd)
    kept = f"{ROOT}/ssh-host-keys"
    assert cmd == (f"[ -f {kept}/ssh_host_ed25519_key ] && cp -p {kept}/ssh_host_* /etc/ssh/; "
                   f"[ -x {ROOT}/boot.sh ] && {ROOT}/boot.sh & exec /start.sh")
    assert spec.start_hook == shlex.join(["/bin/sh", "-c", cmd])


def test_a_vast_box_keeps_its_one_disk_and_runs_its_onstart(fleet: FleetRun) -> None:
    inst, spec = rented(fleet, "vast")
    assert inst.volume_gb == 0 and spec.volume_path is None and spec.disk_kept
    assert spec.disk_gb == 20
    assert spec.start_hook == f"[ -x {ROOT}/boot.sh ] && {ROOT}/boot.sh; exit 0"
