"""Running a tool that is expected to refuse its flags at start-up (shared by the settings and flag tests)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from llama_sparse.binaries import binary


def refuses(tool: str, model: Path, args: list[str], env: dict[str, str] | None = None) -> str:
    """Run `tool -m model args`; it must exit non-zero. Returns what it printed."""
    proc = subprocess.run([str(binary(tool)), "-m", str(model), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0, f"{tool} {' '.join(args)} started"
    return proc.stderr + proc.stdout

