"""The banned-mechanism scan (`job scan`): real ELF files built with gcc, PTX text, and NVIDIA
fatbin containers assembled here; names matched case-insensitively against whole-name globs;
anything the scan cannot read refuses, never passes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from agentbox import Box
from jobtools import (
    COMPRESSED,
    ELF_KIND,
    PTX_KIND,
    fatbin,
    fatbin_entry,
    gcc,
    job,
    outcome,
    ptx,
    pytest_gate,
    runs,
    state_of,
    step_ok,
    workdir,
    write_job,
)

from agent.job.model import load_job
from agent.job.scan import ScanRefused, scan_job

CLEAN_C = "int add(int a, int b) { return a + b; }\n"
CUBLAS_C = "void cublasSgemm(void) {}\nint helper(void) { return 1; }\n"
SOFTMAX_C = "void softmax_kernel(float *x, int n) { for (int i = 0; i < n; i++) x[i] = 0; }\n"
# a kernel named only by its sections, as a cubin names one (.nv.info.<kernel>, .text.<kernel>)
SECTION_C = ('__asm__(".section .nv.info.fused_tanh_k,\\"a\\"\\n.byte 1\\n.previous");\n'
             "int plain(void) { return 0; }\n")


def scan(box: Box, modules: list[str], **admission: list[str]) -> dict:
    jobdir = box.root / "jobs" / "bench"
    if not (jobdir / "job.json").exists():
        write_job(box)
    write_job(box, modules=modules, admission=admission)
    return scan_job(load_job(jobdir))


def refused(box: Box, modules: list[str], **admission: list[str]) -> ScanRefused:
    with pytest.raises(ScanRefused) as e:
        scan(box, modules, **admission)
    return e.value


@pytest.fixture
def work(box: Box) -> Path:
    w = workdir(box.root / "jobs" / "bench")
    w.mkdir(parents=True, exist_ok=True)
    return w


# ---------------------------------------------------------------- ELF


def test_a_shared_object_exporting_cublas_is_refused(box: Box, work: Path) -> None:
    gcc(box.tmp, CUBLAS_C, work / "build" / "libgemm.so", "-shared", "-fPIC")
    gcc(box.tmp, CLEAN_C, work / "build" / "libclean.so", "-shared", "-fPIC")
    e = refused(box, ["build/*.so"])
    assert e.reason == "build/libgemm.so: symbol 'cublasSgemm' matches banned pattern 'cublas*'"
    hit = {"path": "build/libgemm.so", "name": "cublasSgemm", "pattern": "cublas*"}
    assert e.record["hits"] == [hit]
    kinds = {m["path"]: m["kind"] for m in e.record["modules"]}
    assert kinds == {"build/libclean.so": "shared", "build/libgemm.so": "shared"}


def test_a_call_into_cublas_is_a_use_of_it(box: Box, work: Path) -> None:
    """An undefined symbol (an import) is banned as much as a definition."""
    gcc(box.tmp, "void cublasSgemm_v2(void);\nvoid run(void) { cublasSgemm_v2(); }\n",
        work / "caller.o", "-c")
    e = refused(box, ["*.o"])
    assert "symbol 'cublasSgemm_v2' matches banned pattern 'cublas*'" in e.reason


def test_an_object_with_a_softmax_function_is_refused(box: Box, work: Path) -> None:
    gcc(box.tmp, SOFTMAX_C, work / "build" / "softmax.o", "-c")
    e = refused(box, ["build/*.o"])
    assert "'softmax_kernel' matches banned pattern '*softmax*'" in e.reason
    assert e.record["modules"][0]["kind"] == "relocatable"


def test_a_clean_module_passes_and_counts_its_names(box: Box, work: Path) -> None:
    gcc(box.tmp, CLEAN_C, work / "build" / "libclean.so", "-shared", "-fPIC")
    record = scan(box, ["build/*.so"])
    (module,) = record["modules"]
    assert module["path"] == "build/libclean.so" and module["kind"] == "shared"
    assert module["names"] > 1 and record["hits"] == [] and record["hit_count"] == 0


def test_patterns_are_case_insensitive_whole_name_globs(box: Box, work: Path) -> None:
    gcc(box.tmp, "void CUBLASLT_matmul(void) {}\nvoid my_matrixmultiply_f(void) {}\n"
                 "void gemm_tanhish(void) {}\n", work / "mixed.o", "-c")
    e = refused(box, ["mixed.o"], banned_symbols=["cublas*", "matrixmultiply", "*TANH*"])
    names = {h["name"]: h["pattern"] for h in e.record["hits"]}
    # 'matrixmultiply' (no stars) matches only that whole name, not a name containing it
    assert names == {"CUBLASLT_matmul": "cublas*", "gemm_tanhish": "*TANH*"}
    assert e.reason.endswith("(and 1 more)")


def test_an_allowed_pattern_overrides_a_banned_one(box: Box, work: Path) -> None:
    gcc(box.tmp, SOFTMAX_C, work / "softmax.o", "-c")
    record = scan(box, ["softmax.o"], allowed_symbols=["SOFTMAX_KERNEL"])
    assert record["hits"] == [] and record["modules"][0]["names"] > 0
    e = refused(box, ["softmax.o"], allowed_symbols=["softmax_other"])
    assert "softmax_kernel" in e.reason


def test_a_cubin_is_read_for_symbols_and_kernel_section_names(box: Box, work: Path) -> None:
    gcc(box.tmp, SECTION_C, work / "kernels" / "k.cubin", "-c")
    e = refused(box, ["kernels/*.cubin"])
    assert e.reason == "kernels/k.cubin: symbol 'fused_tanh_k' matches banned pattern '*tanh*'"
    assert e.record["modules"][0]["kind"] == "cubin"


def test_a_host_object_with_an_embedded_fatbin_is_scanned_inside(box: Box, work: Path) -> None:
    clean = gcc(box.tmp, CLEAN_C, box.tmp / "clean.so", "-shared", "-fPIC")
    blob = box.tmp / "device.fatbin"
    blob.write_bytes(fatbin(fatbin_entry(PTX_KIND, ptx("row_softmax").encode())))
    subprocess.run(["objcopy", "--add-section", f".nv_fatbin={blob}", str(clean),
                    str(work / "libhost.so")], check=True, capture_output=True)
    e = refused(box, ["libhost.so"])
    assert e.reason == "libhost.so: symbol 'row_softmax' matches banned pattern '*softmax*'"
    assert e.record["modules"][0]["entries"] == [{"kind": "ptx", "names": 1}]


# ---------------------------------------------------------------- PTX and fatbin


def test_a_ptx_with_a_banned_entry_is_refused(box: Box, work: Path) -> None:
    (work / "k.ptx").write_text(ptx("softmax_fwd"))
    e = refused(box, ["*.ptx"])
    assert e.reason == "k.ptx: symbol 'softmax_fwd' matches banned pattern '*softmax*'"
    (work / "k.ptx").write_text(ptx("clean_k", calls="fast_tanhf"))
    e = refused(box, ["*.ptx"])
    assert "'fast_tanhf' matches banned pattern '*tanh*'" in e.reason
    (work / "k.ptx").write_text(ptx("clean_k"))  # its comment names cublasSgemm: no use
    record = scan(box, ["*.ptx"])
    assert record["modules"] == [{"path": "k.ptx", "kind": "ptx", "names": 1}]


def test_a_fatbin_is_scanned_entry_by_entry(box: Box, work: Path) -> None:
    elf = gcc(box.tmp, CLEAN_C, box.tmp / "clean.o", "-c").read_bytes()
    (work / "clean.fatbin").write_bytes(fatbin(fatbin_entry(ELF_KIND, elf),
                                               fatbin_entry(PTX_KIND, ptx("add_k").encode())))
    record = scan(box, ["*.fatbin"])
    (module,) = record["modules"]
    assert module["kind"] == "fatbin" and [e["kind"] for e in module["entries"]] == ["elf", "ptx"]
    assert [e["names"] for e in module["entries"]] == [1, 1]  # add, add_k
    bad_elf = gcc(box.tmp, SOFTMAX_C, box.tmp / "bad.o", "-c").read_bytes()
    (work / "bad.fatbin").write_bytes(fatbin(fatbin_entry(PTX_KIND, ptx("add_k").encode()),
                                             fatbin_entry(ELF_KIND, bad_elf)))
    e = refused(box, ["*.fatbin"])
    assert e.reason == "bad.fatbin: symbol 'softmax_kernel' matches banned pattern '*softmax*'"
    only_ptx = fatbin(fatbin_entry(PTX_KIND, ptx("matrixmultiply").encode()))
    (work / "bad.fatbin").write_bytes(only_ptx)
    assert "'matrixmultiply'" in refused(box, ["bad.fatbin"]).reason


def test_a_compressed_fatbin_entry_is_refused_not_passed(box: Box, work: Path) -> None:
    elf = gcc(box.tmp, CLEAN_C, box.tmp / "clean.o", "-c").read_bytes()
    (work / "packed.fatbin").write_bytes(
        fatbin(fatbin_entry(PTX_KIND, b"\x04\x22\x4d\x18 lz4 bytes", flags=0x11 | COMPRESSED),
               fatbin_entry(ELF_KIND, elf)))
    e = refused(box, ["*.fatbin"])
    assert e.reason.startswith("cannot scan packed.fatbin: fatbin entry at offset 16 is "
                               "compressed")


@pytest.mark.parametrize("content,why", [
    (b"INPUT(-lfoo)\n", "neither ELF, an NVIDIA fatbin nor PTX text"),  # a linker script
    (b"\x7fELF\x02\x01\x01" + b"\0" * 20, "not a readable ELF file"),
    (fatbin(fatbin_entry(7, b"????")), "of unknown kind 7"),
    (fatbin(fatbin_entry(ELF_KIND, b"not an elf")), "says ELF but holds no ELF image"),
    (fatbin(fatbin_entry(PTX_KIND, b"ok"))[:-3], "is truncated"),
])
def test_what_cannot_be_read_is_refused(box: Box, work: Path, content: bytes, why: str) -> None:
    (work / "mod.so").write_bytes(content)
    e = refused(box, ["mod.so"])
    assert e.reason.startswith("cannot scan mod.so: ") and why in e.reason


def test_a_glob_matching_nothing_is_refused(box: Box, work: Path) -> None:
    gcc(box.tmp, CLEAN_C, work / "build" / "libclean.so", "-shared", "-fPIC")
    assert refused(box, ["build/*.so", "build/*.cubin"]).reason == \
        "module glob 'build/*.cubin' matched nothing"


# ---------------------------------------------------------------- through the CLI


def test_a_scan_refusal_is_recorded_and_nothing_runs_after_it(box: Box) -> None:
    jobdir = write_job(box, modules=["build/*.so", "kernels/*.ptx"],
                       gates=[pytest_gate("g", 1, "echo x >> gate-ran")])
    gcc(box.tmp, CUBLAS_C, workdir(jobdir) / "build" / "libgemm.so", "-shared", "-fPIC")
    (workdir(jobdir) / "kernels").mkdir()
    (workdir(jobdir) / "kernels" / "k.ptx").write_text(ptx("clean_k"))
    step_ok(box, "admit", jobdir)
    step_ok(box, "fetch", jobdir)
    done = job(box, "scan", jobdir)
    assert done.returncode == 3
    assert done.stderr.strip() == ("refused: scan: build/libgemm.so: symbol 'cublasSgemm' "
                                   "matches banned pattern 'cublas*'")
    state = state_of(done)
    assert state["phase"] == "refused" and state["invocations"] == 0
    assert [m["path"] for m in state["scan"]["modules"]] == ["build/libgemm.so",
                                                              "kernels/k.ptx"]
    assert outcome(jobdir)["refused"]["step"] == "scan"
    for step in ("gate", "run"):
        assert job(box, step, jobdir).returncode == 3
    assert runs(jobdir) == 0 and not (workdir(jobdir) / "gate-ran").exists()


def test_a_clean_scan_through_the_cli_lets_the_job_go_on(box: Box) -> None:
    jobdir = write_job(box, modules=["build/*.so"])
    gcc(box.tmp, CLEAN_C, workdir(jobdir) / "build" / "libclean.so", "-shared", "-fPIC")
    for step in ("admit", "fetch"):
        step_ok(box, step, jobdir)
    state = step_ok(box, "scan", jobdir)
    assert state["phase"] == "scanned" and state["scan"]["modules"][0]["kind"] == "shared"
    step_ok(box, "gate", jobdir)
    assert job(box, "run", jobdir, "--wait").returncode == 0 and runs(jobdir) == 1
