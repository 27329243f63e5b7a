"""Where things live in a llama-sparse checkout, and the pin of the upstream tree."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from llama_sparse.errors import UserError

PIN_FILE = Path("vendor") / "upstream.toml"


@dataclass(frozen=True)
class Pin:
    """The pinned upstream: which sdist carries it, its hash and the upstream commit it holds."""

    package: str
    version: str
    sha256: str
    subdir: str
    upstream_commit: str
    upstream_date: str

    @classmethod
    def load(cls, path: Path) -> "Pin":
        try:
            data = tomllib.loads(path.read_text())
            return cls(**{k: str(data[k]) for k in cls.__dataclass_fields__})
        except (OSError, KeyError, TypeError, tomllib.TOMLDecodeError) as e:
            raise UserError(f"{path}: not a valid pin file ({e})") from e

    @property
    def sdist_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}.tar.gz"


@dataclass(frozen=True)
class Project:
    """A checkout of this repository."""

    root: Path

    @classmethod
    def find(cls, start: Path | None = None) -> "Project":
        """The checkout holding `start` (default: the working directory, then this file)."""
        env = os.environ.get("LLAMA_SPARSE_ROOT")
        candidates = [Path(env)] if env else []
        candidates += [start or Path.cwd(), Path(__file__).resolve()]
        for c in candidates:
            for d in [c, *c.resolve().parents]:
                if (d / PIN_FILE).is_file() and (d / "patches").is_dir():
                    return cls(d)
        raise UserError(
            "not inside a llama-sparse checkout (no vendor/upstream.toml found); "
            "run from the repository or set LLAMA_SPARSE_ROOT"
        )

    @property
    def pin(self) -> Pin:
        return Pin.load(self.root / PIN_FILE)

    @property
    def vendor_dir(self) -> Path:
        return self.root / "vendor" / "llama.cpp"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def version(self) -> str:
        return (self.root / "VERSION").read_text().strip()


UPSTREAM_TAG = "upstream"   # the vendor tree's tag on the pinned upstream commit


def cache_dir() -> Path:
    """Downloads (sdist, model wheels) live here, shared by every checkout."""
    base = os.environ.get("LLAMA_SPARSE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llama-sparse"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Fetched and generated models, in the download cache."""
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
