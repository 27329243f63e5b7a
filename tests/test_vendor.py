"""`llama-sparse vendor`: hash before extraction, fresh repo tagged upstream, never overwrite."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from llama_sparse.errors import UserError
from llama_sparse.gitrepo import GitRepo
from llama_sparse.project import PIN_FILE, UPSTREAM_TAG, Project
from llama_sparse.vendor import download_sdist, vendor

UPSTREAM = "0123456789abcdef0123456789abcdef01234567"


def make_sdist(path: Path) -> str:
    """A tiny sdist laid out like llama-cpp-python's, with a .git gitlink to be dropped."""
    files = {
        "pkg-1.0/README.md": b"not vendored\n",
        "pkg-1.0/vendor/llama.cpp/CMakeLists.txt": b"project(fake)\n",
        "pkg-1.0/vendor/llama.cpp/src/llama.cpp": b"int main() { return 0; }\n",
        "pkg-1.0/vendor/llama.cpp/.git": b"gitdir: ../../.git/modules/vendor/llama.cpp\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_project(root: Path, sha256: str, upstream: str = UPSTREAM) -> Project:
    (root / "vendor").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "patches" / "series").write_text("")
    (root / PIN_FILE).write_text(
        f'package = "pkg"\nversion = "1.0"\nsha256 = "{sha256}"\nsubdir = "vendor/llama.cpp"\n'
        f'upstream_commit = "{upstream}"\nupstream_date = "2026-10-01T00:00:00+00:00"\n')
    return Project(root)


def test_fresh_tree_is_upstream_commit_tagged(tmp_path: Path) -> None:
    sdist = tmp_path / "pkg-1.0.tar.gz"
    project = make_project(tmp_path / "p", make_sdist(sdist))
    vendor(project, sdist=sdist, log=lambda m: None)
    tree = project.vendor_dir
    assert (tree / "src" / "llama.cpp").read_bytes() == b"int main() { return 0; }\n"
    assert not (tree / "README.md").exists()          # only the subdir is extracted
    assert (tree / ".git").is_dir()                   # a fresh repo, not the sdist's gitlink
    repo = GitRepo(tree)
    assert repo.rev(UPSTREAM_TAG) == repo.rev("HEAD")
    assert f"Upstream-Commit: {UPSTREAM}" in repo.out("log", "-1", "--format=%B")
    assert repo.out("ls-files").splitlines() == ["CMakeLists.txt", "src/llama.cpp"]


def test_same_sdist_gives_same_commit(tmp_path: Path) -> None:
    sdist = tmp_path / "pkg-1.0.tar.gz"
    sha = make_sdist(sdist)
    commits = []
    for name in ("a", "b"):
        project = make_project(tmp_path / name, sha)
        vendor(project, sdist=sdist, log=lambda m: None)
        commits.append(GitRepo(project.vendor_dir).rev(UPSTREAM_TAG))
    assert commits[0] == commits[1]


def test_existing_tree_left_alone_then_refused_when_dirty(tmp_path: Path) -> None:
    sdist = tmp_path / "pkg-1.0.tar.gz"
    project = make_project(tmp_path / "p", make_sdist(sdist))
    vendor(project, sdist=sdist, log=lambda m: None)
    messages: list[str] = []
    vendor(project, sdist=sdist, log=messages.append)
    assert any("left alone" in m for m in messages)

    (project.vendor_dir / "src" / "llama.cpp").write_text("int main() { return 1; }\n")
    with pytest.raises(UserError, match="uncommitted changes"):
        vendor(project, sdist=sdist, log=lambda m: None)
    assert (project.vendor_dir / "src" / "llama.cpp").read_text() == "int main() { return 1; }\n"


def test_unexported_commit_refused(tmp_path: Path) -> None:
    sdist = tmp_path / "pkg-1.0.tar.gz"
    project = make_project(tmp_path / "p", make_sdist(sdist))
    vendor(project, sdist=sdist, log=lambda m: None)
    repo = GitRepo(project.vendor_dir)
    (project.vendor_dir / "new.c").write_text("/* work */\n")
    repo.run("add", "new.c")
    repo.run("commit", "-q", "-m", "work in progress")
    with pytest.raises(UserError, match="not exported.*\n.*work in progress"):
        vendor(project, sdist=sdist, log=lambda m: None)


def test_other_upstream_refused(tmp_path: Path) -> None:
    sdist = tmp_path / "pkg-1.0.tar.gz"
    sha = make_sdist(sdist)
    project = make_project(tmp_path / "p", sha)
    vendor(project, sdist=sdist, log=lambda m: None)
    (project.root / PIN_FILE).write_text((project.root / PIN_FILE).read_text().replace(UPSTREAM, "f" * 40))
    with pytest.raises(UserError, match=f"holds upstream {UPSTREAM}, but the pin asks for f{{40}}"):
        vendor(project, sdist=sdist, log=lambda m: None)


def test_tampered_fake_sdist_refused_nothing_extracted(tmp_path: Path) -> None:
    sdist = tmp_path / "pkg-1.0.tar.gz"
    sha = make_sdist(sdist)
    data = bytearray(sdist.read_bytes())
    data[len(data) // 2] ^= 0x01
    sdist.write_bytes(bytes(data))
    project = make_project(tmp_path / "p", sha)
    with pytest.raises(UserError) as e:
        vendor(project, sdist=sdist, log=lambda m: None)
    assert sha in str(e.value) and hashlib.sha256(bytes(data)).hexdigest() in str(e.value)
    assert not project.vendor_dir.exists()
    assert list((project.root / "vendor").iterdir()) == [project.root / PIN_FILE]


@pytest.mark.slow
def test_cli_refuses_real_sdist_with_one_byte_changed(tmp_path: Path, project: Project) -> None:
    """The must-show: the real pinned sdist, one byte flipped, through the command line."""
    real = download_sdist(project.pin, log=lambda m: None)
    tampered = tmp_path / real.name
    shutil.copyfile(real, tampered)
    with open(tampered, "r+b") as f:
        f.seek(1_000_000)
        b = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([b[0] ^ 0xFF]))
    scratch = tmp_path / "checkout"
    (scratch / "vendor").mkdir(parents=True)
    shutil.copyfile(project.root / PIN_FILE, scratch / PIN_FILE)
    shutil.copytree(project.patches_dir, scratch / "patches")
    proc = subprocess.run([sys.executable, "-m", "llama_sparse", "vendor", "--sdist", str(tampered)],
                          cwd=scratch, capture_output=True, text=True)
    assert proc.returncode != 0
    assert project.pin.sha256 in proc.stderr
    assert hashlib.sha256(tampered.read_bytes()).hexdigest() in proc.stderr
    assert not (scratch / "vendor" / "llama.cpp").exists()
