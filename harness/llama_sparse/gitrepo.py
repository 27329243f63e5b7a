"""A thin wrapper over the git command line, with a fixed identity so commits are reproducible."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llama_sparse.errors import UserError

IDENTITY = {
    "GIT_AUTHOR_NAME": "llama-sparse",
    "GIT_AUTHOR_EMAIL": "llama-sparse@localhost",
    "GIT_COMMITTER_NAME": "llama-sparse",
    "GIT_COMMITTER_EMAIL": "llama-sparse@localhost",
}


@dataclass(frozen=True)
class GitRepo:
    path: Path

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, **IDENTITY, **(env or {})}
        # A developer's global config must not change what we commit or export.
        full_env["GIT_CONFIG_NOSYSTEM"] = "1"
        full_env["GIT_CONFIG_GLOBAL"] = os.devnull
        proc = subprocess.run(
            ["git", "-C", str(self.path), "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false",
             "-c", "tag.gpgsign=false", *args],
            capture_output=True, text=True, env=full_env, input=input,
        )
        if check and proc.returncode != 0:
            raise UserError(f"git {' '.join(args)} failed in {self.path}:\n{proc.stderr.strip()}")
        return proc

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def is_repo(self) -> bool:
        if not (self.path / ".git").exists():
            return False
        return self.run("rev-parse", "--git-dir", check=False).returncode == 0

    def rev(self, ref: str) -> str | None:
        proc = self.run("rev-parse", "-q", "--verify", f"{ref}^{{commit}}", check=False)
        return proc.stdout.strip() or None

    def dirty(self) -> list[str]:
        """Uncommitted changes, untracked files included (a build folder inside is not work)."""
        lines = self.run("status", "--porcelain", "--untracked-files=normal").stdout.splitlines()
        return [ln for ln in lines if not ln[3:].startswith("build")]
