"""Files replaced whole: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def replace_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write(file)` into a temporary file beside `path`, then put it in place of `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_atomically(path: Path, data: bytes) -> None:
    replace_atomically(path, lambda f: f.write(data))
