"""A box as the fleet records it (a registry row), and the rules every layer reads off a row:
which boxes are live, unfinished, unread, or standing."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from fleet.core.states import LIVE, UNFINISHED, BoxKind, BoxStatus

if TYPE_CHECKING:
    from fleet.core.config import Config


@dataclass
class Row:
    label: str
    provider: str
    role: str
    kind: BoxKind
    card: str
    gpu_count: int
    usd_per_hour: float
    status: BoxStatus = BoxStatus.RENTING  # renting -> ... -> destroyed | vanished | failed
    provider_id: str | None = None
    driver: str | None = None
    cloud: str | None = None  # the offer's tier: RunPod SECURE/COMMUNITY, Vast datacenter/...
    # where it runs, as the spread counts it (`fleet.ops.spread.place`): "vast machine 12345",
    # "runpod data center EU-RO-1"; None where the provider names neither
    place: str | None = None
    ssh_host: str | None = None
    ssh_port: int | None = None
    public_ip: str | None = None
    p2p_public_port: int | None = None
    host_key: str | None = None  # pinned "ssh-ed25519 AAAA..." line
    standing: bool = False
    standing_since: str | None = None
    node_sha16_wanted: str | None = None
    rerent_of: str | None = None
    # the roster slot it fills ("role/provider/card/gpus#n", `fleet.ops.owed`): the database
    # holds at most one live box per slot, so a second rent for it is refused
    slot: str | None = None
    # the live box this one takes over from: it is destroyed once this one is checked well
    move_of: str | None = None
    move_for: str | None = None  # why it moves: "place" (the spread) or "port" (owed a port)
    created_at: str = ""
    destroyed_at: str | None = None
    # money while stopped: storage only (None: unknown, estimated at full price), and since when
    # a listing has shown the box stopped (the loop keeps it; None while it runs)
    stopped_usd_per_hour: float | None = None
    stopped_at: str | None = None
    note: str | None = None
    # one-shot boxes: the job, its deadline and what became of it
    job: str | None = None
    # the job's outputs folder under its work directory, from the operator's job file: the
    # teardown reads back this folder and no other (never what the box's job.json says)
    outputs: str | None = None
    expires_at: str | None = None  # created + the job's TTL: past it the meter is flagged
    # the latest a legitimate job could still run by its agent's deadlines (jobstate.cap_at):
    # past it the box's word no longer counts
    cap_at: str | None = None
    job_state: str | None = None  # the box's phase: refused, running, finished, failed, ...
    invocations: int | None = None  # 0 when refused: a fault of the box, never a result
    refusal: str | None = None  # "gpu: driver 580.105.08 is not the admitted 580.95.05"
    store_commit: str | None = None  # the store commit the outputs were read back at
    read_back: str | None = None  # the job whose outputs both copies matched (None: not yet)
    teardown: str | None = None  # why the last teardown kept the box (None: not tried or done)
    # the job whose outputs keep the box for a reason that lasts until someone changes them
    # (a link, a name the store cannot hold, no outputs folder): `--expired` reads it no more
    kept_lasting: str | None = None
    # why the fleet wants this box gone though its destroy failed (over budget at the price
    # listed after its rent): the loop destroys it, never adopts it; the budget counts it
    destroy_wanted: str | None = None

    def __post_init__(self) -> None:
        # the stored words as their members (a hand edit's other word is kept as it reads)
        if not isinstance(self.status, BoxStatus):
            self.status = BoxStatus.read(self.status)
        if not isinstance(self.kind, BoxKind):
            self.kind = BoxKind.read(self.kind)

    @property
    def live(self) -> bool:
        return self.destroyed_at is None and self.status in LIVE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def unfinished(row: Row) -> bool:
    """A rent that stopped (a crash, an interrupt, a box that never came up) before its box
    was SSH-ready and pinned: live and still `renting` or `provisioning`, or in any live
    status without a pinned host key (a box that exited or went silent while it booted). A
    box the fleet wants destroyed is never one."""
    return row.destroyed_at is None and not row.destroy_wanted and (
        row.status in UNFINISHED or (row.status in LIVE and not row.host_key))


def unread(row: Row) -> bool:
    """Does the row name a one-shot job whose outputs were not read back yet?"""
    return bool(row.job) and row.read_back != row.job


def is_standing(cfg: Config, row: Row) -> bool:
    """A box of a standing role, converted or not: by the row's kind or fleet.toml's role. Such
    a box is never destroyed by a teardown, and only with --force by `fleet destroy`."""
    role = cfg.roles.get(row.role)
    return row.standing or row.kind == BoxKind.STANDING or (role is not None
                                                           and role.kind == BoxKind.STANDING)
