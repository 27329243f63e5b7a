"""The patch stack: check passes on ours and names the file when one byte changes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparse import patches
from llama_sparse.project import PIN_FILE, Project

pytestmark = pytest.mark.skipif(not (Project.find(Path(__file__).parent).vendor_dir / ".git").exists(),
                                reason="needs `llama-sparse vendor` first")


def scratch_copy(project: Project, root: Path) -> Project:
    """A checkout whose patches/ we may spoil, sharing the real vendor tree read-only."""
    (root / "vendor").mkdir(parents=True)
    shutil.copyfile(project.root / PIN_FILE, root / PIN_FILE)
    shutil.copytree(project.patches_dir, root / "patches")
    (root / "vendor" / "llama.cpp").symlink_to(project.vendor_dir)
    return Project(root)


def run_check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llama_sparse", "patches", "check"],
                          cwd=root, capture_output=True, text=True)


def test_check_passes_on_our_stack(project: Project) -> None:
    proc = run_check(project.root)
    assert proc.returncode == 0, proc.stderr
    assert patches.read_series(project.patches_dir), "the stack is never empty"


def test_one_byte_changed_in_message_fails_naming_file(project: Project, tmp_path: Path) -> None:
    copy = scratch_copy(project, tmp_path / "c")
    victim = copy.patches_dir / patches.read_series(copy.patches_dir)[0]
    text = victim.read_bytes()
    i = text.index(b"must say so")
    victim.write_bytes(text[:i] + b"M" + text[i + 1:])
    proc = run_check(copy.root)
    assert proc.returncode != 0
    assert victim.name in proc.stderr


def test_one_byte_changed_in_diff_fails_naming_file(project: Project, tmp_path: Path) -> None:
    copy = scratch_copy(project, tmp_path / "c")
    victim = copy.patches_dir / patches.read_series(copy.patches_dir)[0]
    text = victim.read_bytes()
    i = text.index(b"\n+", text.index(b"diff --git")) + 2   # first byte of an added line
    victim.write_bytes(text[:i] + bytes([text[i] ^ 0x20]) + text[i + 1:])
    proc = run_check(copy.root)
    assert proc.returncode != 0
    assert victim.name in proc.stderr


def test_message_without_trailer_or_why_is_flagged(tmp_path: Path) -> None:
    bare = tmp_path / "x.patch"
    bare.write_text("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
                    "From: a <a@b>\nSubject: [PATCH] x\n\n---\n a | 1 +\n")
    reasons = " ".join(p.reason for p in patches.lint_message(bare))
    assert "why" in reasons and "Upstream-Status" in reasons


def test_unlisted_patch_is_flagged(project: Project, tmp_path: Path) -> None:
    copy = scratch_copy(project, tmp_path / "c")
    first = copy.patches_dir / patches.read_series(copy.patches_dir)[0]
    shutil.copyfile(first, copy.patches_dir / "stray.patch")
    proc = run_check(copy.root)
    assert proc.returncode != 0 and "stray.patch" in proc.stderr


def test_apply_export_round_trip(project: Project, tmp_path: Path) -> None:
    """Apply onto a private clone of upstream and export again: the same bytes."""
    root = tmp_path / "c"
    (root / "vendor").mkdir(parents=True)
    shutil.copyfile(project.root / PIN_FILE, root / PIN_FILE)
    shutil.copytree(project.patches_dir, root / "patches")
    subprocess.run(["git", "clone", "-q", "--shared", str(project.vendor_dir), str(root / "vendor" / "llama.cpp")],
                   check=True)
    copy = Project(root)
    from llama_sparse.gitrepo import GitRepo

    GitRepo(copy.vendor_dir).run("fetch", "-q", "origin", "refs/tags/upstream:refs/tags/upstream")
    patches.apply(copy, discard=True, log=lambda m: None)
    before = {p.name: p.read_bytes() for p in copy.patches_dir.iterdir()}
    patches.export(copy, log=lambda m: None)
    after = {p.name: p.read_bytes() for p in copy.patches_dir.iterdir()}
    assert before == after
    # applying again is a no-op, not a second stack
    patches.apply(copy, log=lambda m: None)
    assert patches.unexported_commits(copy) == []
