"""`llama-sparse cuda-check`: compile every CUDA translation unit our patches touch, with nvcc.

No GPU runs in CI, so the CUDA side of the patch set is held to compiling: each translation
unit below, for sm_86 and sm_90, with the defines ggml's CMake gives it (the default
FlashAttention type pairs among them). The headers of cuBLAS come from the PyPI wheel named in
DESIGN.md (only its include/ folder is extracted, after its sha256 is checked); nothing links.

A touched `.cu` file must be in `TRANSLATION_UNITS`; a touched `.cuh` header is covered by
the units that include it (the vector kernel instances the gates use, one tile and one MMA
instance, the dispatcher). `touched_cuda_files` reads the patch set so a test can hold the
list to that.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.project import Project, cache_dir
from llama_sparse.vendor import sha256_file

CUBLAS_WHEEL = "nvidia-cublas==13.0.2.14"
CUBLAS_WHEEL_SHA256 = "0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c"
CUBLAS_INCLUDE_IN_WHEEL = "nvidia/cu13/include/"

ARCHS = ("86", "90")

CUDA_DIR = "ggml/src/ggml-cuda"
TRANSLATION_UNITS = (
    "sparse-attn.cu",                                            # the fill and select kernels
    "fattn.cu",                                                  # kernel choice with a block selection
    "ggml-cuda.cu",                                              # dispatch and supports_op
    "fattn-tile.cu",
    "template-instances/fattn-vec-instance-f16-f16.cu",          # FA-VEC with the block skip
    "template-instances/fattn-vec-instance-q8_0-q8_0.cu",
    "template-instances/fattn-tile-instance-dkq64-dv64.cu",      # takes the selection argument
    "template-instances/fattn-mma-f16-instance-ncols1_1-ncols2_8.cu",
)

# ggml's default GGML_CUDA_FA_QUANTS (ggml/CMakeLists.txt) and its types (ggml/cmake/common.cmake)
FA_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16")
FA_QUANTS = ("q4_0-q4_0", "q8_0-q8_0", "f16-f16", "bf16-bf16")


@dataclass
class UnitResult:
    unit: str
    ok: bool
    seconds: float
    output: str = ""

    def first_errors(self, n: int = 12) -> str:
        lines = [ln for ln in self.output.splitlines() if "error" in ln.lower()]
        return "\n".join((lines or self.output.splitlines())[:n])


@dataclass
class CheckResult:
    source: Path
    archs: tuple[str, ...]
    units: list[UnitResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.units) and all(u.ok for u in self.units)

    @property
    def failed(self) -> list[UnitResult]:
        return [u for u in self.units if not u.ok]


def touched_cuda_files(project: Project) -> set[str]:
    """Paths (relative to the ggml CUDA folder) of the files the patch set changes there."""
    touched: set[str] = set()
    pattern = re.compile(rf"^diff --git a/{re.escape(CUDA_DIR)}/(\S+) b/", re.M)
    for patch in sorted(project.patches_dir.glob("*.patch")):
        touched.update(pattern.findall(patch.read_text(errors="replace")))
    return touched


def cublas_headers(log=print) -> Path:
    """The include/ folder of the pinned cuBLAS wheel, downloaded and extracted once."""
    name, version = CUBLAS_WHEEL.split("==")
    out = cache_dir() / f"{name}-{version}-include"
    if (out / "cublas_v2.h").is_file():
        return out
    log(f"fetching the cuBLAS headers ({CUBLAS_WHEEL}, about 420 MB, headers only are kept)")
    with tempfile.TemporaryDirectory(prefix="llama-sparse-cublas-") as tmp:
        proc = subprocess.run(["python3", "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--disable-pip-version-check", "-q", "-d", tmp, CUBLAS_WHEEL],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise UserError(f"could not download {CUBLAS_WHEEL}: {(proc.stdout + proc.stderr).strip()[-800:]}")
        digest = sha256_file(wheels[0])
        if digest != CUBLAS_WHEEL_SHA256:
            raise UserError(f"{wheels[0].name}: sha256 {digest} is not the pinned {CUBLAS_WHEEL_SHA256}; refusing it")
        staging = Path(tempfile.mkdtemp(prefix=".cublas-", dir=out.parent if out.parent.exists() else None))
        try:
            with zipfile.ZipFile(wheels[0]) as z:
                for member in z.namelist():
                    if member.startswith(CUBLAS_INCLUDE_IN_WHEEL) and not member.endswith("/"):
                        target = staging / member[len(CUBLAS_INCLUDE_IN_WHEEL):]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(z.read(member))
            if not (staging / "cublas_v2.h").is_file():
                raise UserError(f"{wheels[0].name} holds no {CUBLAS_INCLUDE_IN_WHEEL}cublas_v2.h")
            out.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


def nvcc_command(source: Path, unit: str, cublas_include: Path, archs: tuple[str, ...]) -> list[str]:
    ggml = source / "ggml"
    defines = ["GGML_CUDA_USE_GRAPHS", "GGML_SCHED_MAX_COPIES=4", f'GGML_CUDA_FA_QUANTS="{",".join(FA_QUANTS)}"']
    for type_v in FA_TYPES:
        for type_k in FA_TYPES:
            compiled = 1 if f"{type_k}-{type_v}" in FA_QUANTS else 0
            defines.append(f"GGML_CUDA_FA_{type_k.upper()}_{type_v.upper()}={compiled}")
    cmd = [_nvcc(), "-std=c++17", "-O3", "-extended-lambda", "-use_fast_math", "-c",
           str(ggml / "src" / "ggml-cuda" / unit), "-o", os.devnull,
           "-I", str(ggml / "include"), "-I", str(ggml / "src"), "-I", str(ggml / "src" / "ggml-cuda"),
           "-I", str(cublas_include)]
    for arch in archs:
        cmd += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    return cmd + [f"-D{d}" for d in defines]


def check(source: Path, units: tuple[str, ...] = TRANSLATION_UNITS, archs: tuple[str, ...] = ARCHS,
          jobs: int = 2, log=print, timeout: float = 900) -> CheckResult:
    """Compile `units` of the tree at `source` (a llama.cpp checkout) for `archs`."""
    missing = [u for u in units if not (source / CUDA_DIR / u).is_file()]
    if missing:
        raise UserError(f"{source / CUDA_DIR}: no {', '.join(missing)}")
    include = cublas_headers(log)
    result = CheckResult(source, archs)

    def one(unit: str) -> UnitResult:
        t0 = time.monotonic()
        try:
            proc = subprocess.run(nvcc_command(source, unit, include, archs), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return UnitResult(unit, False, time.monotonic() - t0, f"error: nvcc took more than {timeout:.0f} s")
        r = UnitResult(unit, proc.returncode == 0, time.monotonic() - t0, proc.stdout + proc.stderr)
        log(f"  {'ok  ' if r.ok else 'FAIL'} {unit} ({r.seconds:.0f} s)")
        return r

    log(f"compiling {len(units)} CUDA translation units for sm_{', sm_'.join(archs)} with {jobs} jobs")
    # the slowest first, so the two jobs finish together
    order = sorted(units, key=lambda u: (u != "ggml-cuda.cu", "mma" not in u, u))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        result.units = list(pool.map(one, order))
    return result


def _nvcc() -> str:
    exe = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
    if exe is None:
        raise UserError("nvcc is not installed (CUDA toolkit 13.0); the CUDA compile check needs it")
    return exe

