"""The `fleet` command line (Typer + Rich). Every table also prints as --json."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from fleet import budget
from fleet import offers as offers_mod
from fleet import rent as rent_mod
from fleet.config import PROVIDERS, Config, load
from fleet.errors import AuthFailed, FleetError, ProviderError, UsageError
from fleet.providers import all_providers, cards
from fleet.providers.base import Provider
from fleet.registry import Registry, Row, check_label, now_iso, parse_iso, unread

if TYPE_CHECKING:
    from fleet.loop import Owe
from fleet.sync import view

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Rent, convert, check and tear down rented GPU boxes.")
sandbox_app = typer.Typer(no_args_is_help=True, help="The local sandbox cloud.")
app.add_typer(sandbox_app, name="sandbox")
release_app = typer.Typer(no_args_is_help=True, help="The release store the fleet publishes.")
app.add_typer(release_app, name="release")

out = Console()
err = Console(stderr=True)
_state: dict[str, Any] = {}


@app.callback()
def _root(config: Path = typer.Option(None, "--config", "-c", help="fleet.toml to use",
                                      envvar="FLEET_CONFIG")) -> None:
    _state["config_path"] = config


def cfg() -> Config:
    if "config" not in _state:
        _state["config"] = load(_state.get("config_path"))
    c: Config = _state["config"]
    return c


def registry() -> Registry:
    return Registry(cfg().registry)


def providers() -> dict[str, Provider]:
    return dict(all_providers())


def card_option(card: str | None) -> str | None:
    """A --card in any spelling of a known card (`rtx 4090`, RunPod's `NVIDIA GeForce RTX
    4090`) as the fleet's name; an unknown card is a usage error."""
    if card is None:
        return None
    name = cards.canonical(card)
    if name is None:
        raise UsageError(f"unknown card {card!r} (known: {cards.known()})")
    return name


def emit(table: Table, data: Any, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
    else:
        out.print(table)


def _uptime(created_at: str) -> str:
    try:
        t = parse_iso(created_at)
    except ValueError:
        return "?"
    s = int((datetime.now(UTC) - t).total_seconds())
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@app.command("offers")
def offers_cmd(role: str, card: str = typer.Option(None, help="only this card, e.g. 'RTX 4090'"),
               gpus: int = typer.Option(1, min=1), limit: int = typer.Option(10, min=1),
               as_json: bool = typer.Option(False, "--json")) -> None:
    """The cheapest admissible offers for ROLE across both providers."""
    wanted = card_option(card)
    r = cfg().role(role)
    found, failures = offers_mod.search(r, providers().values(), card=wanted, gpus=gpus)
    for f in failures:
        err.print(f"warning: {f}")
    t = Table(title=f"offers for {role} (driver {r.admitted_driver or 'any'})")
    for c in ("provider", "offer", "card", "gpus", "USD/h", "driver", "cuda", "where"):
        t.add_column(c)
    rows = found[:limit]
    for o in rows:
        t.add_row(o.provider, o.offer_id, o.card, str(o.gpu_count), f"{o.usd_per_hour:.3f}",
                  o.driver or "(after boot)", o.cuda or "", o.country or o.cloud or "")
    emit(t, [{k: v for k, v in o.__dict__.items() if k != "raw"} for o in rows], as_json)


@app.command("rent")
def rent_cmd(role: str, provider: str = typer.Option(None, help="runpod or vast"),
             card: str = typer.Option(None), gpus: int = typer.Option(1, min=1),
             label: str = typer.Option(None, help="label to use (default: generated)"),
             wait: bool = typer.Option(True, help="wait until SSH answers and pin its host key"),
             dry_run: bool = typer.Option(False, "--dry-run"),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Rent one box for ROLE: cheapest admissible offer, within the daily budget.

    With the --label of a rent that stopped half-way (a crash while renting or waiting for
    SSH), resume it: the box its provider lists under the label is recorded and waited for;
    if there is none, the label is rented again there (budget checked).
    """
    wanted = card_option(card)
    c, reg = cfg(), registry()
    r = c.role(role)
    if provider and provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r} (runpod, vast)")
    old = None
    if label:
        check_label(label)
        old = reg.get(label)
        if old is not None:
            rent_mod.check_resume(old, r, provider)
    if old is not None:
        ps = _providers()
        again = f"fleet rent {role} --label {label}"
        p = rent_mod.provider_for(ps, old.provider, f"cannot resume {label}")
        try:
            box = rent_mod.find_unfinished(p, old)
        except ProviderError as e:
            raise rent_mod.cannot_ask(e, old.label, again) from None
        if box is not None:
            if dry_run:
                out.print(f"dry run: would resume {old.label}: record {old.provider} box "
                          f"{box.box_id} ({box.status}) and wait for SSH")
                return
            row = rent_mod.record(reg, old.label, box)
            _rented(c, reg, ps, row.label, wait, as_json)
            return
        chosen = {old.provider: p}
    elif provider:
        ps = _providers()
        chosen = {provider: rent_mod.provider_for(ps, provider, f"cannot rent on {provider}")}
    else:
        ps = chosen = providers()  # no key at all: AuthFailed names the variables
    found, failures = offers_mod.search(r, chosen.values(), card=wanted, gpus=gpus)
    for f in failures:
        err.print(f"warning: {f}")
    if dry_run:
        if not found:
            raise FleetError(f"no admissible offer for {role}")
        o = found[0]
        day = budget.project_new(reg.rows(), c.daily_budget_usd, o.usd_per_hour,
                                 replacing=old.label if old else None)
        verdict = "fits" if day.fits else "would be REFUSED"
        resumed = f" under the unfinished label {old.label}" if old else ""
        out.print(f"dry run: would rent {o.card} x{o.gpu_count} on {o.provider} "
                  f"(offer {o.offer_id}) at ${o.usd_per_hour:.3f}/h{resumed}; projected day "
                  f"${day.total_usd:.2f}, run rate ${day.run_rate_usd:.2f} a day, of "
                  f"${day.budget_usd:.2f}: {verdict}")
        return
    res = rent_mod.rent(c, reg, r, found, ps, label=label, resume=old is not None)
    _rented(c, reg, ps, res.row.label, wait, as_json)


def _providers() -> dict[str, Provider]:
    """The providers with a key; none at all is an empty dict (the caller names the key)."""
    try:
        return providers()
    except AuthFailed:
        return {}


def _rented(c: Config, reg: Registry, ps: dict[str, Provider], label: str, wait: bool,
            as_json: bool) -> None:
    """Wait for the rented box (unless told not to) and show its row."""
    row = rent_mod.wait_ready(c, reg, ps, [label])[label] if wait else reg.get(label)
    if row is None:
        raise FleetError(f"{label}: its registry row went missing while renting")
    t = Table(title="rented")
    for col in ("label", "provider", "id", "card", "USD/h", "status", "ssh"):
        t.add_column(col)
    t.add_row(row.label, row.provider, row.provider_id or "", row.card,
              f"{row.usd_per_hour:.3f}", row.status, f"{row.ssh_host}:{row.ssh_port}")
    emit(t, row.to_dict(), as_json)


@app.command("roster")
def roster_cmd(
    as_json: bool = typer.Option(False, "--json"),
    all_rows: bool = typer.Option(False, "--all", help="include destroyed boxes"),
) -> None:
    """The fleet's boxes with their live status and what they cost."""
    c, reg, ps = cfg(), registry(), providers()
    v = view(reg, ps)
    for f in v.failures:
        err.print(f"warning: {f}")
    live = {row.label: box for row, box in v.matched}
    rows = [r for r in reg.rows() if all_rows or r.live]
    t = Table(title="roster")
    for col in ("label", "role", "kind", "provider", "card", "USD/h", "uptime", "status", "job"):
        t.add_column(col)
    data = []
    total = 0.0
    for r in rows:
        box = live.get(r.label)
        status = box.status if box else ("gone" if r in v.gone else r.status)
        if r.live:
            total += r.usd_per_hour
        up = _uptime(r.created_at) if r.live else "-"
        t.add_row(r.label, r.role, r.kind, r.provider, r.card, f"{r.usd_per_hour:.3f}", up,
                  status + (" (standing)" if r.standing else ""), _job_cell(r))
        data.append({**r.to_dict(), "live_status": status})
    for b in v.orphans:
        t.add_row(b.label or "?", "-", "-", b.provider, b.card, f"{b.usd_per_hour:.3f}", "-",
                  f"ORPHAN {b.box_id}", "-")
    owed = _owed(reg)
    for o in owed:
        t.add_row("-", o.role, "owed", o.provider, f"{o.card} x{o.gpus}", "-", "-",
                  f"OWED since {o.since}: {o.reason}", "-")
    money = _money(c, reg, ps)
    t.caption = (f"total ${total:.3f}/h, ${total * 24:.2f}/day; spent today "
                 f"${money['spent_today_usd']:.2f} ({money['boxes_from_bills']} boxes from the "
                 f"bills), committed until midnight ${money['committed_until_midnight_usd']:.2f}"
                 f", run rate ${money['run_rate_usd_per_day']:.2f}/day, budget "
                 f"${money['daily_budget_usd']:.2f}")
    emit(t, {"boxes": data, "orphans": [b.to_dict() for b in v.orphans],
             "owed": [o.for_page().to_dict() | {"rerent_of": o.rerent_of} for o in owed],
             "usd_per_hour": total, "usd_per_day": total * 24, "money": money}, as_json)


def _money(c: Config, reg: Registry, ps: dict[str, Provider]) -> dict[str, Any]:
    """Spent today (the providers' bills where they give one), committed, the budget."""
    from fleet import bills

    now = datetime.now(UTC)
    read = bills.refresh(c.registry, ps, now)
    for name, why in read.errors.items():
        err.print(f"warning: no bill from {name} ({why}); its boxes are estimated")
    rows = reg.rows()
    billed = bills.billed(rows, read, now)
    day = budget.project(rows, c.daily_budget_usd, now=now, billed=billed)
    return {"spent_today_usd": round(day.spent_usd, 6), "boxes_from_bills": len(billed),
            "committed_until_midnight_usd": round(day.committed_usd, 6),
            "run_rate_usd_per_day": round(day.rate_usd, 6),
            "daily_budget_usd": day.budget_usd}


def _owed(reg: Registry) -> list[Owe]:
    """The wanted boxes the loop's last tick could not rent (none before a loop ran)."""
    from fleet.loop import Memory

    return Memory.load(reg.path.parent / "loop.json").owed


def _job_cell(r: Row) -> str:
    """A one-shot row's job and what became of it; a refusal reads as a fault, not a result."""
    if not r.job:
        return "-"
    state = r.job_state or "staged"
    if r.refusal:
        state = f"REFUSED ({r.refusal}), 0 invocations"
    if r.teardown:
        state += f"; {r.teardown}"
    return f"{r.job}: {state}"


@app.command("destroy")
def destroy_cmd(label: str,
                force: bool = typer.Option(False, help="also destroy a standing box, or a "
                                           "one-shot box whose outputs were not read back"),
                dry_run: bool = typer.Option(False, "--dry-run")) -> None:
    """Destroy the box LABEL (boxes of standing roles only with --force).

    A row without a provider id (a rent stopped before it learnt one) is looked up by its
    label at its provider; the row is marked destroyed once the provider lists no such box.
    """
    c, reg = cfg(), registry()
    row = reg.get(check_label(label))
    if row is None:
        raise UsageError(f"no box labelled {label!r} in the registry")
    if not row.live:
        raise UsageError(f"{label} is already {row.status}")
    if _standing(c, row) and not force:
        raise UsageError(f"{label} is a box of the standing role {row.role}; standing boxes are "
                         "replaced, not destroyed (use --force to destroy it anyway)")
    if unread(row) and not force:
        raise UsageError(f"{label} holds job {row.job}, whose outputs were not read back: run "
                         f"`fleet teardown {label}` (or --force to lose them)")
    if dry_run and row.provider_id:
        out.print(f"dry run: would destroy {label} ({row.provider} {row.provider_id}, "
                  f"${row.usd_per_hour:.3f}/h)")
        return
    p = rent_mod.provider_for(_providers(), row.provider, f"cannot destroy {label}")
    again = f"fleet destroy {label}"
    if row.provider_id:
        p.destroy(row.provider_id)  # returns once the provider no longer lists it
    elif dry_run:
        try:
            box = p.find_by_label(label)
        except ProviderError as e:
            raise rent_mod.cannot_ask(e, label, again) from None
        what = f"{row.provider} {box.box_id}" if box else f"no box at {row.provider} carries it"
        out.print(f"dry run: would destroy {label} ({what}, ${row.usd_per_hour:.3f}/h)")
        return
    else:
        rent_mod.destroy_by_label(p, reg, label, again)
    reg.update(label, status="destroyed", destroyed_at=now_iso())
    out.print(f"destroyed {label}")


def _standing(c: Config, row: Row) -> bool:
    """A box of a standing role, converted or not: by the row's kind or fleet.toml's role."""
    role = c.roles.get(row.role)
    return row.standing or row.kind == "standing" or (role is not None and
                                                      role.kind == "standing")


@app.command("check")
def check_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """Is every standing box well (SSH, agent, sync, exec tip, prover, admission, node binary),
    and does every one-shot box still earn its meter (TTL, job ended, outputs verified)?"""
    from fleet import check as check_mod
    from fleet import watchdog
    from fleet.inventory import build

    c = cfg()
    results = check_mod.check(c, build(c, providers()))
    watched = watchdog.watch(c, registry())
    t = Table(title="standing boxes")
    for col in ("label", "ssh", "agent", "synced", "blocks", "exec tip", "prover", "admission",
                "node", "verdict"):
        t.add_column(col)
    for h in results:
        node = h.node_sha16 or "-"
        if h.wanted_sha16:
            node += " ok" if h.node_sha16 == h.wanted_sha16 else f" (wanted {h.wanted_sha16})"
        tip = "-" if h.exec_tip is None else f"{h.exec_tip}{'' if h.exec_moving else ' stuck'}"
        t.add_row(h.label, "ok" if h.ssh else "DOWN", "up" if h.agent else "DOWN",
                  str(h.synced), str(h.blocks), tip, h.prover or "-",
                  "ok" if h.admitted else f"refused: {h.admission_reason}", node,
                  "well" if h.well else "; ".join(h.problems))
    if not results:
        t.caption = "no standing boxes in the inventory"
    emit(t, [{"kind": "standing", **h.to_dict()} for h in results]
         + [{"kind": "oneshot", **w.to_dict()} for w in watched], as_json)
    if watched and not as_json:
        w_table = Table(title="one-shot boxes (meter watchdog)")
        for col in ("label", "job", "phase", "age", "TTL left", "verdict"):
            w_table.add_column(col)
        for w in watched:
            left = "-" if w.ttl_left_min is None else f"{w.ttl_left_min:.0f} min"
            w_table.add_row(w.label, w.job or "-", w.phase or "-", f"{w.age_min:.0f} min", left,
                            "well" if w.well else "; ".join(w.problems))
        out.print(w_table)
    if any(not h.well for h in results) or any(not w.well for w in watched):
        raise typer.Exit(1)


@app.command("converge")
def converge_cmd(
    role_kind: str = typer.Argument(..., help="what to converge: standing"),
    dry: bool = typer.Option(False, "--dry", help="show what would change, change nothing"),
) -> None:
    """Run the deploy for ROLE_KIND, then the testinfra checks against the same inventory."""
    import subprocess

    if role_kind != "standing":
        raise UsageError(f"nothing to converge for {role_kind!r} (standing)")
    repo = Path(__file__).resolve().parent.parent
    # --dry shows the detected changes; with -y pyinfra would skip detecting them
    deploy = ["pyinfra", "--dry" if dry else "-y", "--limit", "standing", "inventory.py",
              "deploys/standing.py"]
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "FLEET_CONFIG": str(cfg().path)}  # pyinfra and the checks read the same fleet.toml
    if subprocess.run(deploy, cwd=repo, env=env).returncode != 0:
        raise FleetError("the standing deploy failed (see pyinfra's output above)")
    if dry:
        return
    checks = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/infra"]
    if subprocess.run(checks, cwd=repo, env=env).returncode != 0:
        raise FleetError("the testinfra checks failed after the deploy")


# --- releases and publishing ----------------------------------------------------------------

@release_app.command("add")
def release_add(src: Path = typer.Argument(..., help="folder with igneumd, igneum-miner, "
                                           "igneum-prover"),
                version: str = typer.Option(..., "--version", help="e.g. 1.6.0"),
                as_json: bool = typer.Option(False, "--json")) -> None:
    """Record the release in SRC as VERSION: files copied, sizes and sha256 in the manifest."""
    from fleet import releases

    if not src.is_dir():
        raise UsageError(f"{src}: not a folder")
    rel, added = releases.add(cfg().releases, src, version)
    if as_json:
        sys.stdout.write(json.dumps({**rel.to_json(), "added": added}, indent=1) + "\n")
        return
    out.print(f"{'added' if added else 'already recorded:'} release {rel.version} "
              f"(node {rel.node_sha16}) in {cfg().releases}", highlight=False)


@release_app.command("list")
def release_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """The releases in the store, oldest first, with their files' digests and sizes."""
    from fleet import publish as publish_mod
    from fleet import releases

    store = cfg().releases
    rels = releases.sorted_releases(releases.load_or_empty(store))
    t = Table(title=f"releases in {store}")
    for col in ("version", "node sha16", "igneumd", "igneum-miner", "igneum-prover", "files",
                "last publish"):
        t.add_column(col)
    data = []
    for r in rels:
        problems = releases.verify(r)
        try:
            rec = json.loads((r.path / publish_mod.RECORD).read_text())
        except (OSError, ValueError):
            rec = {}
        last = rec.get("outcome") or "-"
        if rec.get("updated_at"):
            last += f" {rec['updated_at']}"
        t.add_row(r.version, r.node_sha16,
                  *(f"{r.sha256[n][:16]} {r.sizes.get(n, '?')} B" for n in releases.FILES),
                  "ok" if not problems else "; ".join(problems), last)
        data.append({**r.to_json(), "path": str(r.path), "problems": problems,
                     "last_publish": {k: rec.get(k) for k in ("outcome", "updated_at")}
                     if rec else None})
    if not rels:
        t.caption = "no releases yet: fleet release add DIR --version V"
    emit(t, data, as_json)


@app.command("publish")
def publish_cmd(
    version: str = typer.Argument(..., help="release version (or node sha16) from the store"),
    role: str = typer.Option(None, help="only the standing boxes of this role"),
    canary: str = typer.Option(None, help="the box that switches first, alone"),
    waves: str = typer.Option("1,rest", help="wave sizes: counts, shares, rest (1,2,25%,rest)"),
    soak: float = typer.Option(0.0, "--soak", help="seconds to wait between waves"),
    allow_downgrade: list[str] = typer.Option(
        [], "--allow-downgrade", help="a box that may be switched although it runs newer"),
    stable_s: int = typer.Option(60, "--stable-s", help="the new node must stay synced this long"),
    deadline_s: int = typer.Option(300, "--deadline-s", help="... within this many seconds"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show the plan; change nothing"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Publish a node release to the standing boxes: stage everywhere, then canary and waves.

    Every box is read back (what its node process runs, never the registry); a box on a newer
    release is left alone; a box not healthy by the deadline is reverted and stops the publish.
    The record in <store>/<version>/publish.json lets the same command resume.
    """
    from fleet import publish as pub
    from fleet.inventory import build

    c = cfg()
    opts = pub.Options(version=version, role=role, canary=canary, waves=waves, soak_s=soak,
                       allow_downgrade=tuple(allow_downgrade), stable_s=stable_s,
                       deadline_s=deadline_s, dry_run=dry_run)
    # the input first: nothing is asked of a provider or a box for a command that is wrong
    from fleet import releases

    rel = releases.find(c.releases, version)
    releases.check_usable(rel)
    pub.parse_waves(waves)
    if canary:
        check_label(canary)
    for label in allow_downgrade:
        check_label(label)
    built = build(c, providers())
    hosts = pub.select(c, built.groups, built.down, opts)
    res = pub.publish(c, hosts, opts, echo=lambda line: err.print(line, markup=False,
                                                                  highlight=False))
    t = Table(title=f"publish {res.release.version} (node {res.release.node_sha16})"
              + (" - dry run" if dry_run else ""))
    for col in pub.COLUMNS:
        t.add_column(col)
    for row in res.rows:
        t.add_row(*pub.cells(row))
    if dry_run:
        t.caption = "waves: " + (" | ".join(", ".join(w) for w in res.waves) or "none")
    else:
        n = len(res.switched_now)
        t.caption = (f"{n} box{'es' if n != 1 else ''} switched now; record "
                     f"{res.record.path if res.record else '-'}")
    emit(t, res.to_dict(), as_json)
    if not res.ok:
        err.print(f"error: publish {res.release.version} failed: {res.failure}",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)


# --- the sandbox: the only commands that know it exists -------------------------------------

def _sandbox_dir() -> Path:
    return Path(os.environ.get("FLEET_SANDBOX_DIR", ".sandbox"))


@sandbox_app.command("up")
def sandbox_up(
    boxes: int = typer.Option(4, min=0, help="boxes to rent, spread over providers"),
    role: str = typer.Option(None, help="role to rent them for (default: first standing)"),
    backend: str = typer.Option("auto", help="ns (real SSH hosts), null or auto"),
    seed: int = typer.Option(7),
    machines: int = typer.Option(16, min=1, help="machines in each provider's market"),
) -> None:
    """Start the fake provider APIs (and boxes), write .sandbox/env, rent BOXES boxes."""
    from fleet import sandbox_cmd

    sandbox_cmd.up(cfg(), _sandbox_dir(), boxes=boxes, role=role, backend=backend, seed=seed,
                   machines=machines, console=out)


@sandbox_app.command("down")
def sandbox_down() -> None:
    """Destroy the sandbox's boxes and stop everything it started."""
    from fleet import sandbox_cmd

    sandbox_cmd.down(cfg(), _sandbox_dir(), console=out)


@sandbox_app.command("status")
def sandbox_status(as_json: bool = typer.Option(False, "--json")) -> None:
    """Is the sandbox up, where, and with what."""
    from fleet import sandbox_cmd

    data = sandbox_cmd.status(_sandbox_dir())
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")
    else:
        for k, v in data.items():
            out.print(f"{k}: {v}")


@sandbox_app.command("fault")
def sandbox_fault(kind: str,
                  target: str = typer.Argument("*", help="a box label, provider or call; for "
                                               "store_* faults a repository; * for any"),
                  count: int = typer.Option(1, min=1),
                  driver: str = typer.Option(None, help="driver_drift: the driver NVML reports "
                                             "from then on, e.g. 580.105.08")) -> None:
    """Inject a fault by name (no_capacity, rate_limit, host_death, driver_drift, ...,
    store_upload_refused, store_wrong_bytes, store_ghost_commit, store_busy).

    driver_drift on a provider (`vast`, `runpod`) hits the next box rented there: it arrives
    advertising one driver while NVML reports another, as the operators met it."""
    from fleet import sandbox_cmd

    if driver is not None and kind != "driver_drift":
        raise UsageError("--driver goes with driver_drift only")
    res = sandbox_cmd.fault(cfg(), _sandbox_dir(), kind, target, count,
                            **({"driver": driver} if driver else {}))
    out.print(json.dumps(res))


# the one-shot commands live in their own module; importing it registers them on `app`
from fleet import loop_cli, oneshot_cli, page_cli  # noqa: E402,F401


def main() -> None:
    try:
        rc = app(standalone_mode=False)
    except FleetError as e:
        err.print(f"error: {e}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:
        # the command line itself is wrong (unknown command, bad option value): Typer's own
        # usage errors carry format_message()
        fmt = getattr(e, "format_message", None)
        if fmt is None:
            raise
        message = fmt()
        if message:  # empty when the help was shown instead (no command given)
            err.print(f"error: {message}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    # `python -m fleet.cli`: this file runs as __main__, but the command modules register on
    # `fleet.cli.app`; run that one
    from fleet.cli import main as registered_main

    registered_main()

