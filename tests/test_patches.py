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
    (root / "docs").mkdir()
    shutil.copyfile(project.root / patches.STACK_TABLE, root / patches.STACK_TABLE)
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


def _patch(path: Path, status: str, diff: str) -> Path:
    path.write_text("From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
                    f"From: a <a@b>\nSubject: [PATCH] {path.stem}\n\nWhy.\n\n"
                    f"Upstream-Status: {status}\n---\n{diff}")
    return path


_OURS_H = ("diff --git a/include/ours.h b/include/ours.h\nnew file mode 100644\n--- /dev/null\n"
           "+++ b/include/ours.h\n@@ -0,0 +1,3 @@\n+#define OURS_MAX 4\n+struct ours_stats {\n"
           "+LLAMA_API bool ours_get_stats(struct ours_stats * out);\n")
_LOCAL_CPP = ("diff --git a/src/ours.cpp b/src/ours.cpp\n--- a/src/ours.cpp\n+++ b/src/ours.cpp\n"
              "@@ -1,1 +1,2 @@\n+struct partial { int n; };\n")


@pytest.mark.parametrize("uses, flagged", [
    ("+    ours_get_stats(&st);\n", "ours_get_stats"),
    ("+    int n = OURS_MAX;\n", "OURS_MAX"),
    ("+    struct ours_stats st;\n", "ours_stats"),
    ("+    float partial = 0;\n", None),           # a .cpp's own struct is nobody else's
    ("+    int unrelated = 1;\n", None),
])
def test_pending_patch_may_not_use_what_an_inappropriate_one_added(
        tmp_path: Path, uses: str, flagged: str | None) -> None:
    first = _patch(tmp_path / "a.patch", "Inappropriate [ours]", _OURS_H + _LOCAL_CPP)
    second = _patch(tmp_path / "b.patch", "Pending",
                    "diff --git a/tools/x.cpp b/tools/x.cpp\n--- a/tools/x.cpp\n+++ b/tools/x.cpp\n"
                    "@@ -1,1 +1,2 @@\n" + uses)
    problems = patches.lint_status_order([first, second])
    if flagged is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].file == "b.patch"
        assert flagged in problems[0].reason and "a.patch" in problems[0].reason
    # the same use is fine when what it needs is itself Pending, or comes after it
    _patch(first, "Pending", _OURS_H + _LOCAL_CPP)
    assert patches.lint_status_order([first, second]) == []


def test_pending_patch_may_not_touch_a_file_an_inappropriate_one_created(tmp_path: Path) -> None:
    first = _patch(tmp_path / "a.patch", "Inappropriate [ours]", _OURS_H)
    second = _patch(tmp_path / "b.patch", "Pending",
                    "diff --git a/include/ours.h b/include/ours.h\n--- a/include/ours.h\n"
                    "+++ b/include/ours.h\n@@ -1,1 +1,2 @@\n+// more\n")
    problems = patches.lint_status_order([first, second])
    assert [p.file for p in problems] == ["b.patch"] and "include/ours.h" in problems[0].reason


@pytest.mark.parametrize("subject, flagged", [
    ("ggml : add GGML_OP_SPARSE_ATTN_FILL, per-block key bounds", None),
    ("llama, server : a prompt never shares a micro-batch with a decode step", None),
    ("ggml-cpu: the key sketch stops at a tolerance", "form"),
    ("Fix the kernel", "form"),
    ("llama : " + "a" * 70, "characters"),
])
def test_subject_in_upstreams_form_and_short(tmp_path: Path, subject: str, flagged: str | None) -> None:
    path = _patch(tmp_path / "a.patch", "Pending", "")
    path.write_text(path.read_text().replace("Subject: [PATCH] a", f"Subject: [PATCH] {subject}"))
    reasons = " ".join(p.reason for p in patches.lint_subject(path))
    assert (flagged is None and reasons == "") or (flagged is not None and flagged in reasons)


def test_a_patch_stacked_on_top_without_a_concern_is_refused(project: Project, tmp_path: Path) -> None:
    """The stack is the design: a patch the stack table does not name (a fix stacked on top of
    the concern it changes) fails the check until it is folded or its concern written down."""
    copy = scratch_copy(project, tmp_path / "c")
    series = patches.read_series(copy.patches_dir)
    problems = patches.lint_concerns(copy, series)
    assert problems == []
    problems = patches.lint_concerns(copy, series + ["llama-a-fix-on-top.patch"])
    assert [p.file for p in problems] == ["llama-a-fix-on-top.patch"] and "fold it" in problems[0].reason
    problems = patches.lint_concerns(copy, list(reversed(series)))
    assert problems and "order" in problems[0].reason


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
    (root / "docs").mkdir()
    shutil.copyfile(project.root / patches.STACK_TABLE, root / patches.STACK_TABLE)
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


def test_the_generic_supports_op_names_no_backend(project: Project) -> None:
    """Each backend's supports_op decides what it runs; ggml_backend_dev_supports_op asks the
    backend (its registry) and never tests a backend's name."""
    source = (project.vendor_dir / "ggml" / "src" / "ggml-backend.cpp").read_text()
    start = source.index("bool ggml_backend_dev_supports_op(")
    body = source[start:source.index("\n}\n", start)]
    assert "GGML_BACKEND_READS_BLOCK_SEL" in body   # a flash attention with a selection asks the backend
    for name in ('"CPU"', '"CUDA"', "ggml_backend_reg_name", "ggml_backend_dev_type", "GGML_OP_SCSA_ATTN"):
        assert name not in body, name
