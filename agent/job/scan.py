"""`job scan`: the banned-mechanism scan of the job's modules, before anything runs.

Every file the job's `modules` globs match under workdir/ is read for the names it defines or
calls, and each name is matched (case-insensitive, whole name, fnmatch globs) against the
job's `banned_symbols`; an `allowed_symbols` match lets a name through. Any banned name refuses
the job, and so does anything that cannot be read: a scan never passes what it could not see.

- ELF (shared objects, relocatable objects, executables, `.cubin`s), read with pyelftools:
  symbol names from `.symtab` and `.dynsym` (defined and undefined: a call into cuBLAS is a use
  of it), kernel names from section names (`.text.<kernel>`, `.nv.info.<kernel>`, ...), and the
  fatbin containers of `.nv_fatbin` / `__nv_relfatbin` sections (CUDA host code).
- PTX text: `.entry` and `.func` names and the names `call` names.
- NVIDIA fatbin containers (magic 0xBA55ED50; 0x466243B1 inside relocatable host objects):
  each entry's header says its kind (1 = PTX, 2 = ELF), header size, payload size and flags;
  ELF entries are read with pyelftools, PTX entries as text. A compressed entry (flags 0x2000
  or 0x8000), an entry of another kind, or a payload that is not what its kind says refuses.

Where the role bans symbols, a job must name its modules: `modules = []` would scan nothing
and pass anything. Each module's sha256 is recorded (`scan.digests`) and checked again by `run`
just before the command starts (`check_digests`): a gate may not change what was scanned.

pyelftools is imported here only (the supervising daemon never imports it).
"""

from __future__ import annotations

import fnmatch
import io
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agent.base.files import sha256_file
from agent.job.inputs import module_files, unmatched
from agent.job.model import Job

ELF_MAGIC = b"\x7fELF"
FATBIN_MAGICS = (0xBA55ED50, 0x466243B1)
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, header size, payload size
ENTRY_FLAGS_AT = 40  # u64 flags at this offset of an entry header
ENTRY_MIN = 64
FATBIN_COMPRESSED = 0x2000 | 0x8000  # LZ4 (older toolkits), ZSTD (newer)
KIND_PTX, KIND_ELF, KIND_ELF_ALT = 1, 2, 0x10
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KERNEL_SECTION = re.compile(
    r"^(?:\.rela?)?\.(?:text|nv\.info|nv\.shared|nv\.local|nv\.constant\d+)\.(.+)$")
PTX_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
PTX_DECL = re.compile(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)")
PTX_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([A-Za-z_$][\w$]*)")
MAX_HITS = 100  # recorded in the state; the count says how many there were


class Unreadable(Exception):
    """A module (or part of one) the scan cannot see into: a refusal, never a pass."""


class ScanRefused(Exception):
    def __init__(self, reason: str, record: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.record = record


@dataclass
class Names:
    """The names read from one module, and what its parts were."""

    names: set[str] = field(default_factory=set)
    entries: list[dict[str, Any]] = field(default_factory=list)
    count: int = 0  # names read, duplicates included


class Patterns:
    def __init__(self, banned: tuple[str, ...], allowed: tuple[str, ...]) -> None:
        self.banned = [(p, re.compile(fnmatch.translate(p.lower()))) for p in banned]
        self.allowed = re.compile("|".join(fnmatch.translate(p.lower()) for p in allowed)) \
            if allowed else None

    def banned_by(self, name: str) -> str | None:
        """The banned pattern this name matches, unless an allowed one lets it through."""
        low = name.lower()
        for pattern, rx in self.banned:
            if rx.match(low):
                return None if self.allowed is not None and self.allowed.match(low) else pattern
        return None


def scan_job(job: Job) -> dict[str, Any]:
    """{"modules": [{path, kind, names, entries?}], "hits": [...], "hit_count",
    "digests": {path: sha256}}; raises ScanRefused (with the record so far) on a banned name,
    an unreadable module, or no modules where symbols are banned."""
    patterns = Patterns(job.admission.banned_symbols, job.admission.allowed_symbols)
    record: dict[str, Any] = {"modules": [], "hits": [], "hit_count": 0, "digests": {}}
    if job.admission.banned_symbols and not job.modules:
        raise ScanRefused("the role bans symbols but the job names no modules to scan "
                          "(list its compiled modules in `modules`)", record)
    seen: set[str] = set()
    for pattern in job.modules:
        matched = module_files(job.work, pattern)
        if not matched:
            raise ScanRefused(unmatched(pattern), record)
        for rel in matched:
            if rel in seen:
                continue
            seen.add(rel)
            _scan_module(job.work, rel, patterns, record)
    if record["hits"]:
        first = record["hits"][0]
        more = record["hit_count"] - 1
        raise ScanRefused(f"{first['path']}: symbol {first['name']!r} matches banned pattern "
                          f"{first['pattern']!r}" + (f" (and {more} more)" if more else ""),
                          record)
    return record


def _scan_module(work: Path, rel: str, patterns: Patterns, record: dict[str, Any]) -> None:
    """Add the module `rel` (under `work`) to the record: its digest, its kind and names, and
    its banned names among the hits; ScanRefused when it cannot be read."""
    try:
        record["digests"][rel] = sha256_file(work / rel)
        kind, found = scan_file(work / rel)
    except OSError as e:
        raise ScanRefused(f"cannot scan {rel}: {e.strerror or e}", record) from None
    except Unreadable as e:
        raise ScanRefused(f"cannot scan {rel}: {e}", record) from None
    module: dict[str, Any] = {"path": rel, "kind": kind, "names": found.count}
    if found.entries:
        module["entries"] = found.entries
    record["modules"].append(module)
    for name in sorted(found.names):
        hit = patterns.banned_by(name)
        if hit is not None:
            record["hit_count"] += 1
            if len(record["hits"]) < MAX_HITS:
                record["hits"].append({"path": rel, "name": name, "pattern": hit})


def scan_file(path: Path) -> tuple[str, Names]:
    """(kind, names) of one module; Unreadable when it cannot be read for names."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            found = Names()
            if head == ELF_MAGIC:
                f.seek(0)
                kind = _elf(f, found, path.suffix.lower() == ".cubin")
                return kind, found
            if len(head) == 4 and struct.unpack("<I", head)[0] in FATBIN_MAGICS:
                f.seek(0)
                _fatbin(f.read(), found, "")
                return "fatbin", found
            if path.suffix.lower() == ".ptx":
                f.seek(0)
                _ptx(f.read(), found, "")
                return "ptx", found
    except OSError as e:
        raise Unreadable(e.strerror or str(e)) from None
    raise Unreadable("neither ELF, an NVIDIA fatbin nor PTX text")


def _elf(stream: IO[bytes], found: Names, cubin: bool, where: str = "") -> str:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    fatbins: list[tuple[str, bytes]] = []
    try:
        elf = ELFFile(stream)
        kind = "cubin" if cubin or elf["e_machine"] == "EM_CUDA" else {
            "ET_DYN": "shared", "ET_REL": "relocatable", "ET_EXEC": "executable",
        }.get(str(elf["e_type"]), "elf")
        for section in elf.iter_sections():
            kernel = KERNEL_SECTION.match(section.name)
            if kernel:
                _add(found, kernel.group(1))
            if isinstance(section, SymbolTableSection):
                for symbol in section.iter_symbols():
                    # source file names (STT_FILE) name no code
                    if symbol.name and symbol["st_info"]["type"] != "STT_FILE":
                        _add(found, symbol.name)
            if section.name in FATBIN_SECTIONS and section["sh_type"] != "SHT_NOBITS":
                fatbins.append((section.name, section.data()))
    except Unreadable:
        raise
    except Exception as e:  # pyelftools raises ELFError, ELFParseError, struct and others
        raise Unreadable(f"{where}not a readable ELF file ({type(e).__name__}: "
                         f"{_first_line(e)})") from None
    for name, data in fatbins:
        _fatbin(data, found, f"{where}section {name}: ")
    return kind


def _fatbin(data: bytes, found: Names, where: str) -> None:
    """Every container in data (one after another, zero padding between them)."""
    off = 0
    containers = 0
    while off < len(data):
        if not any(data[off:]):
            break  # trailing padding
        if off + FATBIN_HEADER.size > len(data):
            raise Unreadable(f"{where}truncated fatbin header at offset {off}")
        magic, _version, header_size, size = FATBIN_HEADER.unpack_from(data, off)
        if magic not in FATBIN_MAGICS:
            if containers and data[off] == 0:
                off += 1  # alignment between containers
                continue
            raise Unreadable(f"{where}no fatbin magic at offset {off} (0x{magic:08x})")
        start, end = off + header_size, off + header_size + size
        if header_size < FATBIN_HEADER.size or end > len(data):
            raise Unreadable(f"{where}fatbin container at offset {off} is truncated")
        _entries(data, start, end, found, where)
        containers += 1
        off = end
    if not containers:
        raise Unreadable(f"{where}empty fatbin")


def _entries(data: bytes, p: int, end: int, found: Names, where: str) -> None:
    while p < end:
        at = f"{where}fatbin entry at offset {p}"
        if p + ENTRY_MIN > end:
            raise Unreadable(f"{at} is truncated")
        kind, _version, header_size, size = ENTRY_HEADER.unpack_from(data, p)
        (flags,) = struct.unpack_from("<Q", data, p + ENTRY_FLAGS_AT)
        payload_at = p + header_size
        if header_size < ENTRY_MIN or payload_at + size > end:
            raise Unreadable(f"{at} has a malformed header")
        payload = data[payload_at : payload_at + size]
        if flags & FATBIN_COMPRESSED or payload[:4] == ZSTD_MAGIC:
            raise Unreadable(f"{at} is compressed (flags 0x{flags:x}); build the module "
                             "without fatbin compression so that it can be scanned")
        before = found.count
        if kind == KIND_PTX:
            _ptx(payload, found, f"{at}: ")
            found.entries.append({"kind": "ptx", "names": found.count - before})
        elif kind in (KIND_ELF, KIND_ELF_ALT):
            if payload[:4] != ELF_MAGIC:
                raise Unreadable(f"{at} says ELF but holds no ELF image")
            _elf(io.BytesIO(payload), found, True, f"{at}: ")
            found.entries.append({"kind": "elf", "names": found.count - before})
        else:
            raise Unreadable(f"{at} is of unknown kind {kind}")
        p = payload_at + size


def _ptx(raw: bytes, found: Names, where: str) -> None:
    try:
        text = raw.rstrip(b"\0").decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(f"{where}PTX that is not text") from None
    if "\0" in text:
        raise Unreadable(f"{where}PTX that is not text")
    text = PTX_COMMENT.sub(" ", text)
    for rx in (PTX_DECL, PTX_CALL):
        for m in rx.finditer(text):
            _add(found, m.group(1))


def _add(found: Names, name: str) -> None:
    found.names.add(name)
    found.count += 1


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


def check_digests(job: Job, scan: Any) -> str | None:
    """Why the modules are not what the scan read (one changed, gone, or new under a glob),
    or None when every one still has its recorded sha256."""
    digests = scan.get("digests") if isinstance(scan, dict) else None
    if not isinstance(digests, dict):
        return None if not job.modules else "the scan recorded no module digests"
    now = {rel for pattern in job.modules for rel in module_files(job.work, pattern)}
    for rel in sorted(now | set(digests)):
        if rel not in digests:
            return f"module {rel} appeared after the scan"
        try:
            if sha256_file(job.work / rel) == digests[rel]:
                continue
        except OSError:
            return f"module {rel} is gone or unreadable since the scan"
        return f"module {rel} changed after the scan (its sha256 differs)"
    return None
