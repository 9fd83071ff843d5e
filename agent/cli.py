"""`python -m agent run|status|gpu|admit|ports|manifest DIR|stop|readback|storage|switch|job ...`.

Every command but `run` prints one JSON document on stdout (the pyinfra facts parse these) and
exits 0. A user's mistake (bad config, bad argument) is one line `error: ...` on stderr and
exit status 2; a refusal (a second agent, a stop that did not finish) is one line and status 1.
`job STEP JOBDIR` prints the job's state; a refused job exits 3 (agent/job/steps.py).

Each command is a `Command` registered by name in COMMANDS: its arguments and its handler
side by side; `main` parses and looks the command up.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

from agent.base.config import Config, load_config
from agent.base.errors import AgentError, usage_error
from agent.base.gpu import VENDORS
from agent.contract import DEFAULT_CONFIG, EXIT_OK, EXIT_REFUSED, EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


class Command:
    """A subcommand: its name and help line, its arguments (`define`) and what it does (`run`,
    which returns the exit status). Registered by name with `@_command`; the parser lists
    them in the order they are registered. Each imports what it needs inside `run`, so that
    parsing (and the daemon) loads no module of another command."""

    name: ClassVar[str]
    help: ClassVar[str]

    def define(self, p: argparse.ArgumentParser) -> None:
        """Add the command's arguments (none but `--json` unless a command says more)."""
        p.add_argument("--json", action="store_true", help="accepted; output is always JSON")

    def run(self, args: argparse.Namespace) -> int:
        raise NotImplementedError


class ConfigCommand(Command):
    """A command on the agent's own files: `--config` and `--json`, then its arguments; the
    config is loaded before anything else (a bad one is the first error)."""

    def define(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                       help=f"agent.toml (default {DEFAULT_CONFIG})")
        super().define(p)
        self.arguments(p)

    def arguments(self, p: argparse.ArgumentParser) -> None:
        """The command's arguments after `--config` and `--json`."""

    def run(self, args: argparse.Namespace) -> int:
        return self.act(load_config(args.config), args)

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        raise NotImplementedError


COMMANDS: dict[str, Command] = {}

C = TypeVar("C", bound=type[Command])


def _command(cls: C) -> C:
    COMMANDS[cls.name] = cls()
    return cls


@_command
class Run(ConfigCommand):
    name = "run"
    help = "supervise the programs (detaches unless --foreground)"

    def arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--foreground", action="store_true",
                       help="stay attached (under tini, a test, a benchmark)")

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        return _run(cfg, args.foreground)


@_command
class Status(ConfigCommand):
    name = "status"
    help = "print the last status.json and whether the agent is alive"

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        from agent.commands.status import status

        return _print(status(cfg))


@_command
class Admit(ConfigCommand):
    name = "admit"
    help = "print the admission verdict for this box"

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        from agent.base.gpu import check
        from agent.base.journal import utc

        verdict = check(cfg.gpu_vendor, cfg.admitted_driver, cfg.admitted_rocm,
                        cfg.qualified_gpus).as_dict()
        verdict["checked_at"] = utc(verdict["checked_at"])
        return _print(verdict)


@_command
class Ports(ConfigCommand):
    name = "ports"
    help = "print the p2p port mapping the provider gave"

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        from agent.base.ports import find_p2p

        return _print(find_p2p(cfg.p2p_port).as_dict())


@_command
class Stop(ConfigCommand):
    name = "stop"
    help = "stop the programs and the agent"

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        from agent.commands.stop import stop_all

        done = stop_all(cfg)
        _print(done)
        return EXIT_REFUSED if done["survivors"] else EXIT_OK  # a process still runs


@_command
class Readback(ConfigCommand):
    name = "readback"
    help = "print what runs: digests read from /proc, the node's own RPC"

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        from agent.commands.readback import readback

        return _print(readback(cfg))


@_command
class Storage(ConfigCommand):
    name = "storage"
    help = ("review what fills the box (changes nothing), or clean what a saved review listed "
            "as regenerable")

    def arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("action", nargs="?", choices=["review", "clean"], default="review")
        p.add_argument("--from", dest="source", metavar="FILE",
                       help="clean: the saved review (- for stdin)")
        p.add_argument("--dry-run", action="store_true", help="clean: delete nothing")
        p.add_argument("--keep", action="append", default=[], metavar="SHA16",
                       help="clean: also keep releases/SHA16 (the release the fleet wants)")
        p.add_argument("--lock-wait-s", type=float, default=600.0, metavar="S",
                       help="clean: how long to wait for a running switch (default 600)")

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        from agent.commands import storage

        if args.action == "review":
            if args.source or args.dry_run or args.keep:
                raise usage_error("--from, --dry-run and --keep are for `storage clean`")
            return _print(storage.review(cfg))
        if not args.source:
            raise usage_error("storage clean needs --from REVIEW.json (a saved review): "
                              "nothing is deleted without one")
        bad = [k for k in args.keep if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", k)]
        if bad:
            raise usage_error(f"--keep {bad[0]!r} is not a release's folder name")
        return _print(storage.clean(cfg, args.source, args.dry_run, args.lock_wait_s,
                                    frozenset(args.keep)))


@_command
class Switch(ConfigCommand):
    name = "switch"
    help = "point the node at a release, wait until it runs synced, revert on failure"

    def arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--node", required=True, help="absolute path of the node binary")
        p.add_argument("--sha256", required=True, help="its full sha256")
        p.add_argument("--stable-s", type=float, default=60.0,
                       help="synced this long without a break (default 60)")
        p.add_argument("--deadline-s", type=float, default=300.0,
                       help="healthy within this long, else revert (default 300)")

    def act(self, cfg: Config, args: argparse.Namespace) -> int:
        from agent.base.pointer import HEX64
        from agent.commands.switch import switch

        if not HEX64.match(args.sha256):
            raise usage_error(f"--sha256 {args.sha256[:20]!r} is not a sha256")
        if args.stable_s < 0 or args.deadline_s <= 0:
            raise usage_error("--stable-s must be >= 0 and --deadline-s > 0")
        outcome, code = switch(cfg, args.node, args.sha256, args.stable_s, args.deadline_s)
        _print(outcome)
        return code


@_command
class Gpu(Command):
    name = "gpu"
    help = "print the driver, CUDA (ROCm) version and GPUs that NVML (AMD SMI) reports"

    def define(self, p: argparse.ArgumentParser) -> None:
        super().define(p)
        p.add_argument("--vendor", choices=VENDORS, default="nvidia",
                       help="whose library to read (default nvidia)")

    def run(self, args: argparse.Namespace) -> int:
        from agent.base.gpu import read_facts

        return _print(read_facts(args.vendor).as_dict())


@_command
class Manifest(Command):
    name = "manifest"
    help = "print path, size and sha256 of files under DIR"

    def define(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("dir", type=Path)
        super().define(p)
        p.add_argument("--tar", action="store_true",
                       help="send the files as a tar stream on stdout, each read once and "
                            "hashed as sent, the manifest last (needs --save)")
        p.add_argument("--save", type=Path, help="with --tar: keep the manifest here too")
        p.add_argument("--unchanged-since", type=Path, metavar="FILE",
                       help="print what changed (size, mtime) since the read saved in FILE")

    def run(self, args: argparse.Namespace) -> int:
        from agent.base import manifest

        if args.unchanged_since:
            return _print(manifest.unchanged_since(args.dir, args.unchanged_since))
        if args.tar:
            if not args.save:
                raise usage_error("manifest --tar needs --save FILE")
            manifest.stream(args.dir, sys.stdout.buffer, args.save)
            return 0
        return _print(manifest.manifest(args.dir))


@_command
class Job(Command):
    name = "job"
    help = "a one-shot job, step by step: admit, fetch, scan, gate, run; state"
    STEPS = (
        ("admit", "check the exact driver and the qualified GPUs (NVML)"),
        ("fetch", "fetch the toolchain at its pinned commit (warm cache: nothing)"),
        ("scan", "scan the modules for banned symbols and kernels"),
        ("gate", "run the gates in workdir/"),
        ("run", "start the command detached (once); --wait until it has ended"),
        ("state", "print the job's state (with deadline_at while the run or a gate runs)"),
        ("stop", "stop the job (TERM, KILL after --grace), wait for its end to be recorded"),
        ("runner", "internal: the detached runner that `job run` starts"),
    )

    def define(self, p: argparse.ArgumentParser) -> None:
        steps = p.add_subparsers(dest="step", required=True, parser_class=_Parser)
        for step, help_text in self.STEPS:
            s = steps.add_parser(step, help=help_text)
            s.add_argument("jobdir", type=Path, help="<root>/jobs/<name>")
            super().define(s)
            if step == "run":
                s.add_argument("--wait", action="store_true",
                               help="wait until the command has ended; exit 0 only if it "
                                    "exited 0")
            if step == "stop":
                s.add_argument("--grace", type=float, default=10.0, metavar="S",
                               help="seconds between SIGTERM and SIGKILL (default 10)")

    def run(self, args: argparse.Namespace) -> int:
        # only the job modules are imported here (they import huggingface_hub or pyelftools
        # only in the step that needs one); the daemon (`run`) never comes this way
        if args.step == "runner":
            from agent.job.run import runner_main

            return runner_main(args.jobdir)
        from agent.job.steps import run_step

        state, code = run_step(args.step, args.jobdir, wait=getattr(args, "wait", False),
                               grace=getattr(args, "grace", 10.0))
        _print(state)
        return code


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m agent", description="The fleet on-box agent.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS.values():
        command.define(sub.add_parser(command.name, help=command.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except AgentError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    command = COMMANDS.get(args.command)
    if command is None:
        raise usage_error(f"unknown command {args.command}")
    return command.run(args)


def _print(value: Any) -> int:
    print(json.dumps(value, indent=1, sort_keys=True))
    return 0


def _run(cfg: Config, foreground: bool) -> int:
    # The daemon speaks plain http only (its probes); http.client would import ssl for HTTPS,
    # mapping OpenSSL (~4 MiB of RSS) into a process that lives for months. Refused here, in
    # the daemon alone (a process that already loaded ssl keeps it).
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
    from agent.base.detach import detach
    from agent.base.journal import Journal
    from agent.base.lock import AgentLock

    layout = cfg.layout
    try:
        layout.ensure()
    except OSError as e:
        raise AgentError(f"cannot create {layout.root}: {e.strerror}") from None
    lock = AgentLock(layout.lock)
    if not lock.acquire():
        try:
            pid = layout.agent_pid.read_text().strip() or "?"
        except OSError:
            pid = "?"
        raise AgentError(f"an agent already runs for {layout.root} (pid {pid}); not starting "
                         "a second one")
    report = None if foreground else detach(layout.agent_log)
    journal = Journal(layout.agent_log, echo=foreground)
    from agent.daemon.supervisor import Supervisor

    try:
        return Supervisor(cfg, journal).run(ready=report)
    except Exception as e:
        journal(f"agent failed: {type(e).__name__}: {e}")
        if report:
            report(f"error: agent failed while starting: {e}")
        raise
    finally:
        lock.release()
