"""llama-cpp-python on our DSO: installed from the very sdist we pin, with its own native build
turned off, and its tests that need no download run against our libllama.so."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.project import Project, cache_dir
from llama_sparse.vendor import check_sdist, download_sdist

# llama-cpp-python's tests that load no model but the vocab-only GGUFs its sdist ships
# (test_llama_cpp_tokenization is the one that runs the native library end to end)
VOCAB_ONLY_TESTS = (
    "tests/test_llama.py::test_llama_cpp_version",
    "tests/test_llama.py::test_llama_cpp_tokenization",
    "tests/test_llama_chat_format.py",
    "tests/test_llama_grammar.py",
    "tests/test_llama_speculative.py",
)


def installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        return None


def install(project: Project, log=print) -> None:
    """pip-install the pinned llama-cpp-python sdist without its native build (LLAMA_BUILD=OFF):
    the package is then pure Python and loads whatever libllama.so LLAMA_CPP_LIB_PATH names."""
    pin = project.pin
    if installed_version() == pin.version:
        log(f"llama-cpp-python {pin.version} is installed")
        return
    sdist = download_sdist(pin, log)
    check_sdist(sdist, pin)
    log(f"installing llama-cpp-python {pin.version} from {sdist.name} without its native build")
    env = {**os.environ, "CMAKE_ARGS": "-DLLAMA_BUILD=OFF"}
    # --no-cache-dir: pip caches the built wheel by sdist, not by CMAKE_ARGS
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--no-cache-dir", str(sdist)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"pip install of {sdist.name} failed:\n{proc.stderr[-3000:]}")


def tests_tree(project: Project) -> Path:
    """The sdist's tests/ and vendor-only models, extracted once (the tokenization test opens
    ./vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf from the folder it runs in)."""
    pin = project.pin
    dest = cache_dir() / f"llama-cpp-python-{pin.version}-tests"
    marker = dest / ".complete"
    if marker.is_file():
        return dest
    sdist = download_sdist(pin)
    check_sdist(sdist, pin)
    with tarfile.open(sdist, "r:gz") as tar:
        members = []
        for m in tar.getmembers():
            parts = m.name.split("/", 1)
            if len(parts) < 2 or not (m.isfile() or m.isdir()):
                continue
            rel = parts[1]
            if rel.startswith("tests/") or (rel.startswith("vendor/llama.cpp/models/ggml-vocab-") and rel.endswith(".gguf")):
                m.name = rel
                members.append(m)
        if not members:
            raise UserError(f"{sdist} holds no tests/")
        tar.extractall(dest, members=members, filter="data")
    marker.write_text(pin.version)
    return dest


@dataclass(frozen=True)
class TestRun:
    returncode: int
    output: str
    passed: int
    failed: int


def run_tests(project: Project, lib_dir: Path, extra_env: dict[str, str] | None = None) -> TestRun:
    """llama-cpp-python's vocab-only tests with LLAMA_CPP_LIB_PATH=lib_dir (and extra_env, e.g.
    LLAMA_SPARSE_ATTN=on), in a process of their own."""
    import re

    root = tests_tree(project)
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(lib_dir), "HF_HUB_OFFLINE": "1", **(extra_env or {})}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root),
                           "-c", os.devnull, *VOCAB_ONLY_TESTS], cwd=root, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    count = lambda word: sum(int(n) for n in re.findall(rf"(\d+) {word}", out.splitlines()[-1] if out.strip() else ""))
    return TestRun(proc.returncode, out, count("passed"), count("failed") + count("error"))
