"""Distributions ship llama.cpp with GGML_BACKEND_DL: the CPU backend is a module loaded at run
time, and libllama may only reach its functions through ggml_backend_reg_get_proc_address. A
libllama that links against a CPU-backend symbol builds, then fails to load (or loads the wrong
CPU variant's copy). This builds the libraries that way and checks that every ggml symbol
libllama needs is defined by the libraries it links (libggml, libggml-base), not by the module."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llama_sparse.build import toolchain

pytestmark = pytest.mark.slow


def dynamic_symbols(lib: Path, undefined: bool) -> set[str]:
    flag = "--undefined-only" if undefined else "--defined-only"
    out = subprocess.run(["nm", "-D", flag, "--format=posix", str(lib)], capture_output=True, text=True, check=True)
    return {line.split()[0].split("@")[0] for line in out.stdout.splitlines() if line.strip()}


@pytest.fixture(scope="module")
def dl_build(project) -> Path:
    out = project.build_dir / "backend-dl"
    defines = {"CMAKE_BUILD_TYPE": "Release", "GGML_BACKEND_DL": "ON", "BUILD_SHARED_LIBS": "ON",
               "GGML_NATIVE": "OFF", "LLAMA_BUILD_TESTS": "OFF", "LLAMA_BUILD_TOOLS": "OFF",
               "LLAMA_BUILD_EXAMPLES": "OFF", "LLAMA_BUILD_SERVER": "OFF", "LLAMA_BUILD_COMMON": "OFF",
               "LLAMA_OPENSSL": "OFF"}
    # the project's top-level build forces static libraries, so this one configures the vendor
    # tree directly, with the same generator and compiler launcher
    generator, launchers, env = toolchain(project, out)
    defines.update(launchers)
    subprocess.run(["cmake", "-S", str(project.vendor_dir), "-B", str(out), *generator,
                    *[f"-D{k}={v}" for k, v in defines.items()]], check=True, env=env, capture_output=True)
    proc = subprocess.run(["cmake", "--build", str(out), "-j", "2", "--target", "llama", "ggml-cpu"],
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def find_lib(root: Path, name: str) -> Path:
    found = sorted(p for p in root.rglob(name) if p.is_file() and not p.is_symlink()) or sorted(root.rglob(name))
    assert found, f"{name} not found under {root}"
    return found[0]


def test_libllama_reaches_the_cpu_backend_only_through_its_registry(dl_build: Path) -> None:
    libllama = find_lib(dl_build, "libllama.so*")
    linked = dynamic_symbols(find_lib(dl_build, "libggml-base.so*"), undefined=False) | \
        dynamic_symbols(find_lib(dl_build, "libggml.so*"), undefined=False)
    needed = {s for s in dynamic_symbols(libllama, undefined=True) if s.startswith("ggml_")}
    assert needed, "libllama needs no ggml symbol at all: the check would prove nothing"
    missing = sorted(needed - linked)
    assert not missing, f"libllama needs symbols only the CPU backend module defines: {missing}"


def test_the_cpu_backend_module_offers_scsa(dl_build: Path) -> None:
    module = find_lib(dl_build, "libggml-cpu*.so")
    exported = dynamic_symbols(module, undefined=False)
    # the registry entry point of a loadable backend, and the table libllama asks it for
    assert "ggml_backend_init" in exported
    assert "ggml_scsa_get_api" in exported
