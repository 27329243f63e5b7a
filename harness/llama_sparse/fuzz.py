"""`llama-sparse fuzz`: the block-sparse CPU kernels under AddressSanitizer and UBSan.

Builds tools/fuzz (ggml alone plus the fuzz driver, both instrumented) into build/fuzz,
incrementally and with ccache, then runs the driver: random shapes and values (inf and NaN
keys, all-equal keys, a single block, an empty visible range) through fill, select and the
flash-attention block skip, optimized against the reference mode, with the selection's
contract checked. A sanitizer report aborts the run, so it fails like a wrong result does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.project import Project

# halt on the first report: a sanitizer finding is a failure, not a warning
SANITIZER_ENV = {
    "ASAN_OPTIONS": "halt_on_error=1:abort_on_error=0:detect_leaks=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}

SUMMARY = re.compile(r"^fuzz: (\d+) cases, (\d+) failed", re.M)


@dataclass
class FuzzResult:
    returncode: int
    output: str
    cases: int | None
    failed: int | None

    @property
    def sanitizer_report(self) -> bool:
        return "ERROR: AddressSanitizer" in self.output or "runtime error:" in self.output

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.failed == 0 and not self.sanitizer_report


def build(project: Project, jobs: int = 2, log=print) -> Path:
    src = project.root / "tools" / "fuzz"
    out = project.build_dir / "fuzz"
    if not (project.vendor_dir / "ggml" / "CMakeLists.txt").is_file():
        raise UserError(f"{project.vendor_dir} is missing; run `llama-sparse vendor && llama-sparse patches apply`")
    defines = {"CMAKE_BUILD_TYPE": "RelWithDebInfo", "LLAMA_SPARSE_SOURCE_DIR": str(project.vendor_dir)}
    if shutil.which("ccache"):
        defines["CMAKE_C_COMPILER_LAUNCHER"] = defines["CMAKE_CXX_COMPILER_LAUNCHER"] = "ccache"
    generator = ["-G", "Ninja"] if shutil.which("ninja") and not (out / "Makefile").exists() else []
    env = {**os.environ, "CCACHE_BASEDIR": str(project.root)}
    log(f"configuring the sanitizer build in {out}")
    _run(["cmake", "-S", str(src), "-B", str(out), *generator, *[f"-D{k}={v}" for k, v in defines.items()]], env)
    log(f"building llama-sparse-fuzz (ASan + UBSan) with {jobs} jobs")
    _run(["cmake", "--build", str(out), "-j", str(jobs), "--target", "llama-sparse-fuzz"], env)
    return out / "bin" / "llama-sparse-fuzz"


def run(binary: Path, cases: int, seed: int, threads: int = 0, timeout: int = 1800) -> FuzzResult:
    if not binary.is_file():
        raise UserError(f"{binary} is missing; run `llama-sparse fuzz` (it builds it)")
    proc = subprocess.run([str(binary), "--cases", str(cases), "--seed", str(seed), "--threads", str(threads)],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **SANITIZER_ENV})
    output = proc.stdout + proc.stderr
    m = SUMMARY.search(output)
    return FuzzResult(proc.returncode, output, int(m.group(1)) if m else None, int(m.group(2)) if m else None)


def _run(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise UserError(f"{' '.join(cmd[:3])} failed (exit {proc.returncode}):\n{tail}")
