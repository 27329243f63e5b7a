"""Where the llama.cpp binaries of a build are: environment override, build/, or the wheel."""

from __future__ import annotations

import os
from pathlib import Path

from llama_sparse.errors import UserError

ENV_BIN_DIR = "LLAMA_SPARSE_BIN_DIR"            # the patched build
ENV_UPSTREAM_BIN_DIR = "LLAMA_SPARSE_UPSTREAM_BIN_DIR"  # the unpatched build


def bin_dir(variant: str = "patched") -> Path:
    env = os.environ.get(ENV_UPSTREAM_BIN_DIR if variant == "upstream" else ENV_BIN_DIR)
    if env:
        return Path(env)
    from llama_sparse.project import Project

    try:
        from llama_sparse.build import build_dir

        candidate = build_dir(Project.find(), variant) / "bin"
        if candidate.is_dir():
            return candidate
    except UserError:
        pass
    packaged = Path(__file__).parent / "bin"
    if variant == "patched" and packaged.is_dir():
        return packaged
    raise UserError(f"no {variant} build found; run `llama-sparse build{' --upstream' if variant == 'upstream' else ''}`"
                    f" or set {ENV_UPSTREAM_BIN_DIR if variant == 'upstream' else ENV_BIN_DIR}")


def binary(name: str, variant: str = "patched") -> Path:
    path = bin_dir(variant) / name
    if not path.is_file():
        raise UserError(f"{path} does not exist; build it with `llama-sparse build"
                        f"{' --upstream' if variant == 'upstream' else ''}`")
    return path


ENV_LIB_DIR = "LLAMA_SPARSE_LIB_DIR"  # the patched DSO (libllama.so and the ggml libraries)
DSO_NAMES = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")


def lib_dir(variant: str = "patched") -> Path:
    """The folder of the shared libraries: what llama-cpp-python's LLAMA_CPP_LIB_PATH names.

    In a build folder the libraries sit beside the executables (bin/); in the wheel they are
    under llama_sparse/lib, where the executables' RPATH ($ORIGIN/../lib) finds them."""
    env = os.environ.get(ENV_LIB_DIR) if variant == "patched" else None
    if env:
        candidates = [Path(env)]
    else:
        candidates = []
        try:
            candidates.append(bin_dir(variant))
        except UserError:
            pass
        if variant == "patched":
            candidates.append(Path(__file__).parent / "lib")
    for folder in candidates:
        if (folder / "libllama.so").exists():
            return folder
    where = ", ".join(str(c) for c in candidates) or "no build folder"
    raise UserError(f"no libllama.so for the {variant} build (looked in {where}); "
                    f"run `llama-sparse build{' --upstream' if variant == 'upstream' else ''}`"
                    + (f" or set {ENV_LIB_DIR}" if variant == "patched" else ""))
