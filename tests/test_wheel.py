"""`pip install .` as a user meets it: the README's Python example, run exactly as the README
writes it, in a fresh virtual environment inside a clean copy of the tree (what git tracks, the
pinned upstream fetched and patched as the set-up does). It builds our wheel with the DSO inside,
installs llama-cpp-python over it, and runs SmolLM2 through `llama_cpp` with SCSA; the installed
wheel's own `llama-server --version` names the patch set. ccache, where installed, serves the
build (the README's command is unchanged: it only sees the environment)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
WHEEL_BUILD_S = 3600   # from scratch without ccache: about 10 minutes on 2 cores


def readme_python_example() -> str:
    """The shell block of the README's "Using it from Python" section, as written."""
    section = (ROOT / "README.md").read_text().split("## Using it from Python", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def clean_tree(dest: Path) -> None:
    """The files git would commit (tracked and new, not ignored): no build, no vendored upstream."""
    listed = subprocess.run(["git", "ls-files", "-coz", "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run(cmd: list[str] | str, cwd: Path, env: dict[str, str], timeout: float, shell: bool = False) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, shell=shell,
                          executable="/bin/bash" if shell else None)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{cmd if not shell else 'the README example'} exited {proc.returncode}:\n{out[-6000:]}"
    return proc.stdout


def test_pip_install_and_the_readme_python_example(tmp_path: Path, smollm2: Path) -> None:
    src = tmp_path / "llama-sparse"
    clean_tree(src)
    assert not (src / "vendor" / "llama.cpp").exists() and not (src / "build").exists()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("LLAMA_SPARSE_BIN", "LLAMA_SPARSE_LIB", "LLAMA_SPARSE_ROOT", "LLAMA_CPP_LIB",
                                 "VIRTUAL_ENV", "PYTHONPATH", "SKBUILD", "CMAKE_ARGS"))}
    # the set-up's first steps in the copy: the pinned upstream, hash-checked, with the patches applied
    harness = {**base, "PYTHONPATH": str(src / "harness")}
    for step in (["vendor"], ["patches", "apply"]):
        run([sys.executable, "-m", "llama_sparse", *step], src, harness, 900)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**base, "PATH": f"{venv / 'bin'}:{base['PATH']}", "VIRTUAL_ENV": str(venv), "CMAKE_BUILD_PARALLEL_LEVEL": "2"}
    if shutil.which("ccache"):
        env["SKBUILD_CMAKE_ARGS"] = "-DCMAKE_C_COMPILER_LAUNCHER=ccache;-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
        env["CCACHE_BASEDIR"] = str(src)
    (src / "model.gguf").symlink_to(smollm2)

    example = readme_python_example()
    assert "pip install ." in example and "model.gguf" in example
    out = run("set -euo pipefail\n" + example, src, env, WHEEL_BUILD_S, shell=True)
    print(f"the README example's output:\n{out}")
    read_fraction = float(out.split()[-1])
    assert 0 < read_fraction < 1, out          # SCSA read part of the rows
    assert len(out.strip()) > len(out.split()[-1]) + 20, out   # and SmolLM2 wrote a continuation

    # the installed wheel's own binary (outside any checkout, so nothing but the package is found)
    server = run([str(venv / "bin" / "python"), "-c",
                  "from llama_sparse.binaries import binary; print(binary('llama-server'))"],
                 tmp_path, env, 60).strip()
    assert Path(server).is_relative_to(venv), server
    version = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
    print(f"{server} --version:\n{version.stdout}{version.stderr}")
    assert re.search(r"llama-sparse \d+\.\d+\.\d+ \(patch set [0-9a-f]{12}, \d+ patches\)", version.stdout + version.stderr)
    lib = run([str(venv / "bin" / "llama-sparse"), "lib-path"], src, env, 60).strip()
    assert Path(lib).is_relative_to(venv) and (Path(lib) / "libllama.so").is_file(), lib
