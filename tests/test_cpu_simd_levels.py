"""The patched CPU kernels compile at every x86 SIMD level upstream's code selects.

The build uses -march=native, so a machine only ever compiles the branch its own CPU picks:
the sketch scorer once called the 8-lane ggml_v_expf that vec.h does not define when AVX-512
is on, and the patch set failed to build on AVX-512 machines while every test passed on AVX2
ones. Compiling (syntax and types only) for each level catches that on any x86 host.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

# baseline (SSE2: the scalar loops), SSE4.2, AVX2+FMA+F16C, AVX-512F/DQ/BW/VL, and AVX-512 with
# VNNI (Ice Lake server; Zen 4 has the same), which x86-64-v4 lacks: the sketch's sixteen-key
# scorer compiles only there
MARCH_LEVELS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "icelake-server")

# the CPU backend's translation units the patch set adds to or changes most
PATCHED_UNITS = (
    "ggml/src/ggml-cpu/ops.cpp",
    "ggml/src/ggml-cpu/sparse-attn/fattn-tiles.cpp",
    "ggml/src/ggml-cpu/sparse-attn/fill.cpp",
    "ggml/src/ggml-cpu/sparse-attn/select.cpp",
    "ggml/src/ggml-cpu/scsa/scsa-op.cpp",
    "ggml/src/ggml-cpu/scsa/scsa.cpp",
    "ggml/src/ggml-cpu/ggml-cpu.c",
)

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None,
    reason="needs an x86-64 host with g++",
)


def compile_errors(vendor: Path, unit: str, march: str) -> str:
    """The compiler's diagnostics for one unit at one -march level; empty when it compiles."""
    src = vendor / unit
    lang = ["gcc", "-std=gnu11"] if unit.endswith(".c") else ["g++", "-std=gnu++17"]
    cmd = [*lang, "-fsyntax-only", f"-march={march}", "-fopenmp",
           "-DGGML_USE_OPENMP", "-DGGML_USE_CPU_REPACK", "-DGGML_USE_LLAMAFILE", "-D_GNU_SOURCE",
           "-D_XOPEN_SOURCE=600", "-DGGML_BACKEND_BUILD", "-DGGML_BACKEND_SHARED", "-DGGML_SHARED",
           "-DGGML_SCHED_MAX_COPIES=4",
           f"-I{vendor / 'ggml/src'}", f"-I{vendor / 'ggml/src/ggml-cpu'}", f"-I{vendor / 'ggml/include'}",
           str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode == 0:
        return ""
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    return "\n".join(errors[:8]) or r.stderr[-2000:]


@pytest.mark.parametrize("march", MARCH_LEVELS)
def test_patched_cpu_units_compile_at_simd_level(project, march: str) -> None:
    vendor = project.vendor_dir
    missing = [u for u in PATCHED_UNITS if not (vendor / u).is_file()]
    assert not missing, f"the patched tree lacks {missing}: run `llama-sparse patches apply`"
    failures = {u: e for u in PATCHED_UNITS if (e := compile_errors(vendor, u, march))}
    assert not failures, f"-march={march}:\n" + "\n\n".join(f"{u}:\n{e}" for u, e in failures.items())


def test_the_check_fails_on_an_undefined_vector_helper(project, tmp_path: Path) -> None:
    """The failure this test exists for, planted in a copy: a __m256 ggml_v_expf call outside
    vec.h's AVX2 branch does not compile at x86-64-v4, and compiles at x86-64-v3."""
    vendor = project.vendor_dir
    scratch = tmp_path / "tree"
    shutil.copytree(vendor / "ggml", scratch / "ggml",
                    ignore=shutil.ignore_patterns("*.cu", "*.cuh", "*.metal", "*.comp", "*.glsl"))
    unit = "ggml/src/ggml-cpu/planted.cpp"
    (scratch / unit).write_text(
        '#include "vec.h"\n'
        "#if defined(__AVX2__) && defined(__FMA__)\n"
        "__m256 planted(__m256 x) { return ggml_v_expf(x); }\n"
        "#endif\n")
    assert compile_errors(scratch, unit, "x86-64-v3") == ""
    errors = compile_errors(scratch, unit, "x86-64-v4")
    assert "__m256" in errors and "__m512" in errors, errors
