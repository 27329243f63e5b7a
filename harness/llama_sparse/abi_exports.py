"""The exported-symbols check: the symbols each of upstream's shared libraries exports (`nm -D`)
must be exported by ours as well (check 5 of `llama-sparse abi`). It needs shared builds of both
trees.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from llama_sparse.abi_difference import Difference
from llama_sparse.errors import UserError

SHARED_LIBRARIES = ("libllama.so", "libggml.so", "libggml-base.so", "libggml-cpu.so")

# nm's letters for defined functions and objects, global ones (weak and GNU unique/indirect too)
_EXPORTED_KINDS = set("TDBRVWGSiu")


# Weak instantiations of the C++ standard library's templates (std::string's constructors...):
# the compiler emits them wherever it did not inline the code, and a program that uses one
# instantiates its own, never looking for it in libllama. They are not the library's API.
_STD_PREFIXES = ("_ZNSt", "_ZNKSt", "_ZSt", "_ZNSa", "_ZNKSa", "_ZNSs", "_ZNKSs")


def exported_symbols(library: Path) -> set[str]:
    """Defined global symbols of a shared library, less weak standard-library instantiations."""
    nm = shutil.which("nm")
    if not nm:
        raise UserError("the exported-symbols check needs nm (binutils) on PATH")
    proc = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"nm -D {library}: {proc.stderr.strip()}")
    names = set()
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[-2] in _EXPORTED_KINDS:
            if parts[-2] in "WV" and parts[-1].startswith(_STD_PREFIXES):
                continue
            names.add(parts[-1])
    return names


def missing_libraries(*folders: Path, libraries: Iterable[str] = SHARED_LIBRARIES) -> list[Path]:
    return [f / lib for f in folders for lib in libraries if not (f / lib).is_file()]


@dataclass(frozen=True)
class ExportReport:
    libraries: tuple[str, ...]
    n_symbols: int                  # upstream's exported symbols, all libraries
    differences: tuple[Difference, ...]

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        lines = [f"exported symbols: {self.n_symbols} of upstream's in {', '.join(self.libraries)}",
                 f"  differences: {len(self.differences)}"]
        return "\n".join(lines + [f"    {d.message}" for d in self.differences])


def compare_exports(pin_dir: Path, our_dir: Path, libraries: Sequence[str] = SHARED_LIBRARIES) -> ExportReport:
    """Each of upstream's libraries' exported symbols must be exported by our library of the same
    name: a program linked against upstream's libllama.so alone must still link against ours."""
    missing = missing_libraries(pin_dir, our_dir, libraries=libraries)
    if missing:
        raise UserError(f"no shared library at {', '.join(map(str, missing))} (a shared build of both trees is needed)")
    diffs: list[Difference] = []
    total = 0
    for lib in libraries:
        theirs, ours = exported_symbols(pin_dir / lib), exported_symbols(our_dir / lib)
        total += len(theirs)
        diffs += [Difference("export", f"{lib}: {name} exported by upstream, not by ours")
                  for name in sorted(theirs - ours)]
    return ExportReport(tuple(libraries), total, tuple(diffs))
