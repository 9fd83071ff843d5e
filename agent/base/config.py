"""agent.toml: read, check every key, and hand out typed settings.

Every key is optional except each program's `command`; unknown keys are refused so that a typo
never silently turns a guard off. See docs/agent.md for the meaning of each key.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.base import template
from agent.base.errors import usage_error
from agent.base.gpu import VENDORS
from agent.contract import DEFAULT_ROOT, NODE, Layout
from agent.space import read_regular

PLACEHOLDERS = frozenset(
    {"root", "name", "node_bin", "p2p_port", "p2p_public_ip", "p2p_public_port"}
)
PACK_PLACEHOLDERS = PLACEHOLDERS | {"seed"}
PROGRAM_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
MIB = 1 << 20
# fail closed: every program but these is GPU work, gated by admission unless a config says
# otherwise (`needs_gpu = false`): a program the agent does not know is never run unadmitted
CPU_PROGRAMS = frozenset({NODE})


@dataclass(frozen=True)
class ProgramConfig:
    name: str
    command: tuple[str, ...]  # argv template, one placeholder-bearing string per argument
    cwd: str = "{root}"
    env: dict[str, str] = field(default_factory=dict)
    log: str = ""
    needs_gpu: bool = False
    status_url: str = ""
    status_file: str = ""
    match: str = ""
    health_max_age_s: float = 60.0
    restart_unhealthy_after_s: float = 300.0  # 0 = report only
    stop_grace_s: float | None = None


@dataclass(frozen=True)
class RecoveryConfig:
    recipe: tuple[str, ...] = ()
    min_blocks: int = 1000
    cooldown_s: float = 3600.0
    timeout_s: float = 3600.0


@dataclass(frozen=True)
class PackConfig:
    command: tuple[str, ...] = ()
    retry_s: float = 60.0
    timeout_s: float = 600.0


@dataclass(frozen=True)
class Config:
    path: Path
    root: Path = DEFAULT_ROOT
    tick_s: float = 15.0
    stable_s: float = 10.0
    reconcile_s: float = 60.0
    result_every_s: float = 600.0
    stop_grace_s: float = 10.0
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    backoff_jitter: float = 0.2
    degraded_after: int = 5
    log_max_bytes: int = 50 * MIB
    log_keep: int = 5
    gpu_vendor: str = "nvidia"  # whose library admission reads: "nvidia" (NVML) | "amd" (AMD SMI)
    admitted_driver: str = ""  # NVIDIA's driver; on AMD the amdgpu driver
    admitted_rocm: str = ""  # AMD only: the exact ROCm release
    qualified_gpus: tuple[str, ...] = ()
    p2p_port: int = 0
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    miner_pack: PackConfig = field(default_factory=PackConfig)
    programs: dict[str, ProgramConfig] = field(default_factory=dict)

    @property
    def layout(self) -> Layout:
        return Layout(self.root)  # cheap enough for the CLI; the supervisor keeps its own

    def grace(self, program: ProgramConfig) -> float:
        return self.stop_grace_s if program.stop_grace_s is None else program.stop_grace_s


def load_config(path: Path) -> Config:
    """Read and check agent.toml; any problem is one AgentError with exit status 2."""
    try:  # non-blocking: a FIFO in its place is refused, never waited on
        raw = tomllib.loads(read_regular(path, follow=True).decode())
    except FileNotFoundError:
        raise usage_error(f"config {path} not found") from None
    except OSError as e:
        raise usage_error(f"config {path} unreadable: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise usage_error(f"config {path} is not valid TOML: {e}") from None
    return parse_config(raw, path)


def parse_config(raw: dict[str, Any], path: Path) -> Config:
    t = _Table(raw, str(path), "")
    root = Path(t.string("root", str(DEFAULT_ROOT)))
    if not root.is_absolute():
        raise usage_error(f"{path}: root must be an absolute path, got {str(root)!r}")
    cfg = Config(
        path=path,
        root=root,
        tick_s=t.number("tick_s", 15.0, low=0.05),
        stable_s=t.number("stable_s", 10.0, low=0.0),
        reconcile_s=t.number("reconcile_s", 60.0, low=0.1),
        result_every_s=t.number("result_every_s", 600.0, low=0.1),
        stop_grace_s=t.number("stop_grace_s", 10.0, low=0.0),
        backoff_base_s=t.number("backoff_base_s", 1.0, low=0.01),
        backoff_cap_s=t.number("backoff_cap_s", 300.0, low=0.01),
        backoff_jitter=t.number("backoff_jitter", 0.2, low=0.0, high=0.9),
        degraded_after=t.integer("degraded_after", 5, low=1),
        log_max_bytes=t.integer("log_max_bytes", 50 * MIB, low=1024),
        log_keep=t.integer("log_keep", 5, low=1, high=100),
        gpu_vendor=t.string("gpu_vendor", "nvidia"),
        admitted_driver=t.string("admitted_driver", ""),
        admitted_rocm=t.string("admitted_rocm", ""),
        qualified_gpus=tuple(t.string_list("qualified_gpus")),
        p2p_port=t.integer("p2p_port", 0, low=0, high=65535),
        recovery=_recovery(t.table("recovery")),
        miner_pack=_pack(t.table("miner_pack")),
        programs=_programs(t.table("programs")),
    )
    t.done()
    if cfg.backoff_cap_s < cfg.backoff_base_s:
        raise usage_error(f"{path}: backoff_cap_s is below backoff_base_s")
    _check_gpu_pins(cfg, path)
    return cfg


def _check_gpu_pins(cfg: Config, path: Path) -> None:
    """Fail closed: GPU work runs only on a named driver (and on AMD a named ROCm release),
    never on "whatever this box has"."""
    if cfg.gpu_vendor not in VENDORS:
        raise usage_error(f"{path}: gpu_vendor must be one of {', '.join(VENDORS)}, "
                          f"got {cfg.gpu_vendor!r}")
    if cfg.admitted_rocm and cfg.gpu_vendor != "amd":
        raise usage_error(f"{path}: admitted_rocm is for gpu_vendor = \"amd\" only")
    gpu_programs = [name for name, program in cfg.programs.items() if program.needs_gpu]
    if not gpu_programs:
        return
    if not cfg.admitted_driver.strip():
        example = ("the exact amdgpu driver it may run on (e.g. \"6.12.12\")"
                   if cfg.gpu_vendor == "amd" else
                   "the exact NVIDIA driver it may run on (e.g. \"580.95.05\")")
        raise usage_error(f"{path}: programs.{gpu_programs[0]} needs the GPU but "
                          f"admitted_driver is not set; name {example}")
    if cfg.gpu_vendor == "amd" and not cfg.admitted_rocm.strip():
        raise usage_error(f"{path}: programs.{gpu_programs[0]} needs the GPU but admitted_rocm "
                          "is not set; name the exact ROCm release it may run on "
                          "(e.g. \"6.4.1\")")


def _recovery(t: _Table) -> RecoveryConfig:
    value = RecoveryConfig(
        recipe=t.command("recipe", PLACEHOLDERS, required=False),
        min_blocks=t.integer("min_blocks", 1000, low=0),
        cooldown_s=t.number("cooldown_s", 3600.0, low=0.0),
        timeout_s=t.number("timeout_s", 3600.0, low=0.1),
    )
    t.done()
    return value


def _pack(t: _Table) -> PackConfig:
    value = PackConfig(
        command=t.command("command", PACK_PLACEHOLDERS, required=False),
        retry_s=t.number("retry_s", 60.0, low=0.0),
        timeout_s=t.number("timeout_s", 600.0, low=0.1),
    )
    t.done()
    return value


def _programs(t: _Table) -> dict[str, ProgramConfig]:
    programs = {}
    for name in list(t.raw):
        if not PROGRAM_NAME.match(name):
            raise usage_error(f"{t.where}: program name {name!r} must match {PROGRAM_NAME.pattern}")
        p = t.table(name)
        match = p.string("match", "")
        if match:
            try:
                re.compile(match)
            except re.error as e:
                raise usage_error(f"{p.where}.match: not a regular expression: {e}") from None
        grace = p.number("stop_grace_s", -1.0, low=-1.0)
        env = p.string_table("env")
        for key, value in env.items():
            _check_template(value, PLACEHOLDERS, f"{p.where}.env.{key}")
        cwd = p.string("cwd", "{root}")
        log = p.string("log", "{root}/log/" + name + ".log")
        status_file = p.string("status_file", "")
        for key, value in (("cwd", cwd), ("log", log), ("status_file", status_file)):
            _check_template(value, PLACEHOLDERS, f"{p.where}.{key}")
        command = p.command("command", PLACEHOLDERS, required=True)
        try:
            template.check_total(command, env, PLACEHOLDERS)
        except template.TemplateError as e:
            raise usage_error(f"{p.where}.command: {e}") from None
        programs[name] = ProgramConfig(
            name=name,
            command=command,
            cwd=cwd,
            env=env,
            log=log,
            needs_gpu=p.boolean("needs_gpu", name not in CPU_PROGRAMS),
            status_url=p.string("status_url", ""),
            status_file=status_file,
            match=match,
            health_max_age_s=p.number("health_max_age_s", 60.0, low=0.1),
            restart_unhealthy_after_s=p.number("restart_unhealthy_after_s", 300.0, low=0.0),
            stop_grace_s=None if grace < 0 else grace,
        )
        if programs[name].status_url and not programs[name].status_url.startswith("http://"):
            raise usage_error(f"{p.where}.status_url: only http:// URLs are supported")
        p.done()
    return programs


def _check_template(text: str, allowed: frozenset[str], where: str) -> None:
    try:
        template.check(text, allowed)
    except KeyError as e:
        known = ", ".join("{" + p + "}" for p in sorted(allowed))
        raise usage_error(f"{where}: unknown placeholder {{{e.args[0]}}} (known: {known})"
                          ) from None
    except template.TemplateError as e:
        raise usage_error(f"{where}: bad template {text!r}: {e}") from None


class _Table:
    """One TOML table being read; remembers which keys were used so leftovers are refused."""

    def __init__(self, raw: Any, file: str, where: str) -> None:
        if not isinstance(raw, dict):
            raise usage_error(f"{where or file} must be a table")
        self.raw: dict[str, Any] = raw
        self.file = file
        self.where = where or file
        self._seen: set[str] = set()

    def _get(self, key: str) -> Any:
        self._seen.add(key)
        return self.raw.get(key)

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where != self.file else f"{self.file}: {key}"

    def _bad(self, key: str, wanted: str, value: Any) -> Exception:
        return usage_error(f"{self._name(key)} must be {wanted}, got {value!r}")

    def string(self, key: str, default: str) -> str:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def number(self, key: str, default: float, low: float, high: float | None = None) -> float:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, "a number", value)
        if value < low or (high is not None and value > high):
            limit = f">= {low}" + (f" and <= {high}" if high is not None else "")
            raise self._bad(key, f"a number {limit}", value)
        return float(value)

    def integer(self, key: str, default: int, low: int, high: int | None = None) -> int:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer", value)
        if value < low or (high is not None and value > high):
            limit = f">= {low}" + (f" and <= {high}" if high is not None else "")
            raise self._bad(key, f"an integer {limit}", value)
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def string_list(self, key: str) -> list[str]:
        value = self._get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of strings", value)
        return list(value)

    def string_table(self, key: str) -> dict[str, str]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self._bad(key, "a table of strings", value)
        return dict(value)

    def command(self, key: str, allowed: frozenset[str], required: bool) -> tuple[str, ...]:
        """A command: a TOML array of arguments, or one string split the way a shell would."""
        import shlex

        value = self._get(key)
        if value is None or value == "" or value == []:
            if required:
                raise usage_error(f"{self._name(key)} is required")
            return ()
        if isinstance(value, str):
            try:
                argv = shlex.split(value)
            except ValueError as e:
                raise self._bad(key, f"a command line ({e})", value) from None
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            argv = list(value)
        else:
            raise self._bad(key, "a string or a list of strings", value)
        if not argv:
            raise self._bad(key, "a non-empty command", value)
        for arg in argv:
            _check_template(arg, allowed, self._name(key))
        return tuple(argv)

    def table(self, key: str) -> _Table:
        value = self._get(key)
        return _Table({} if value is None else value, self.file, self._name(key))

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self._seen)
        if unknown:
            where = self.where if self.where != self.file else self.file
            raise usage_error(f"{where}: unknown key {unknown[0]!r}")
