"""The CUDA side of the patch set compiles (nvcc, sm_86 and sm_90), and the check can fail."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparse import cudacheck


def test_every_touched_cuda_file_is_compiled(project) -> None:
    touched = cudacheck.touched_cuda_files(project)
    assert "sparse-attn.cu" in touched and "fattn-vec.cuh" in touched   # the patch set has a CUDA part
    cuda = project.vendor_dir / cudacheck.CUDA_DIR
    for path in touched:
        if path.endswith(".cu"):
            assert path in cudacheck.TRANSLATION_UNITS, f"{path} is touched but not compiled by the check"
        else:
            # a header: some compiled unit includes it, directly or through fattn-*.cuh / common.cuh
            name = Path(path).name
            includers = [u for u in cudacheck.TRANSLATION_UNITS
                         if name in (cuda / u).read_text() or
                         any(name in (cuda / h).read_text() for h in re.findall(r'#include "(?:\.\./)?([\w.-]+\.cuh)"',
                                                                               (cuda / u).read_text())
                             if (cuda / h).is_file())]
            assert includers, f"{path} is touched but no compiled unit includes it"


@pytest.mark.slow
def test_patched_cuda_sources_compile(project) -> None:
    r = cudacheck.check(project.vendor_dir, log=lambda _: None)
    assert r.ok, "\n\n".join(f"{u.unit}:\n{u.first_errors()}" for u in r.failed)
    assert {u.unit for u in r.units} == set(cudacheck.TRANSLATION_UNITS)


@pytest.mark.slow
def test_an_injected_error_fails_the_check_and_names_the_file(project, tmp_path: Path) -> None:
    scratch = tmp_path / "llama.cpp"
    shutil.copytree(project.vendor_dir / "ggml", scratch / "ggml",
                    ignore=shutil.ignore_patterns("template-instances", "*.metal", "ggml-vulkan", "ggml-sycl"))
    unit = scratch / cudacheck.CUDA_DIR / "sparse-attn.cu"
    unit.write_text(unit.read_text().replace("const int64_t n_words  = (n_blocks + 31)/32;",
                                             "const int64_t n_words  = (n_blocks + 31)/32 +;", 1))
    proc = subprocess.run([sys.executable, "-m", "llama_sparse", "cuda-check", "--source", str(scratch),
                           "--unit", "sparse-attn.cu", "--archs", "86"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "cuda-check: FAILED: sparse-attn.cu" in proc.stderr
    assert "sparse-attn.cu" in proc.stderr and "error" in proc.stderr
