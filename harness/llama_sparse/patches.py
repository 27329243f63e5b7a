"""`llama-sparse patches apply|export|check`: the patch stack over the `upstream` tag.

patches/ holds one `git format-patch` file per concern and `series`, the order they apply in.
Export is byte-stable (--zero-commit --no-signature --no-numbered, names without numbers) so
that re-applying the stack on a clean upstream and exporting it again must reproduce
patches/ byte for byte; `check` proves it.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.gitrepo import GitRepo
from llama_sparse.project import UPSTREAM_TAG, Project

SERIES = "series"
FORMAT_PATCH_ARGS = ("format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered",
                     "--no-stat", "--full-index")
UPSTREAM_STATUS = re.compile(
    r"^Upstream-Status: (Pending|Submitted \S+|Accepted|Backport|Denied|Inappropriate \[.+\])$", re.M)


def read_series(patches_dir: Path) -> list[str]:
    path = patches_dir / SERIES
    if not path.is_file():
        return []
    names = [ln.strip() for ln in path.read_text().splitlines()]
    return [n for n in names if n and not n.startswith("#")]


def patch_set_digest(patches_dir: Path) -> str:
    """The patch set's name in a build's version line: the first 12 hex digits of the SHA-256 of
    "<file> <sha256 of the file>\n" over the series, as CMakeLists.txt computes it."""
    lines = "".join(f"{name} {hashlib.sha256((patches_dir / name).read_bytes()).hexdigest()}\n"
                    for name in read_series(patches_dir))
    return hashlib.sha256(lines.encode()).hexdigest()[:12]


def _strip_number(name: str) -> str:
    return re.sub(r"^\d{4}-", "", name)


# a patch's file name: the topic its message's trailer gives (short, stable under a reworded
# subject), as ollama's and Electron's stacks name theirs
PATCH_NAME = re.compile(r"^Patch-Name: ([a-z0-9][a-z0-9-]{0,47})$", re.M)


def patch_name(path: Path) -> str | None:
    """The `Patch-Name:` trailer of a format-patch file's message, None without one."""
    message = re.split(r"(?m)^---$", path.read_text(errors="replace"), maxsplit=1)[0]
    m = PATCH_NAME.search(message)
    return f"{m.group(1)}.patch" if m else None


def format_patches(repo: GitRepo, dest: Path) -> list[str]:
    """Export the commits above `upstream` into dest; returns the file names in order: each
    commit's `Patch-Name:`, else its subject as format-patch spells it."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo.run(*FORMAT_PATCH_ARGS, "-o", tmp, f"{UPSTREAM_TAG}..HEAD")
        names = []
        for f in sorted(Path(tmp).iterdir()):
            name = patch_name(f) or _strip_number(f.name)
            if name in names:  # two commits with the same subject: keep them apart
                name = f.name
            shutil.move(str(f), dest / name)
            names.append(name)
    return names


def write_series(dest: Path, names: list[str]) -> None:
    header = "# Order in which the patches apply onto the `upstream` tag (git am -3).\n"
    (dest / SERIES).write_text(header + "".join(f"{n}\n" for n in names))


def unexported_commits(project: Project) -> list[str]:
    """Subjects of vendor commits whose export differs from what patches/ holds."""
    repo = GitRepo(project.vendor_dir)
    with tempfile.TemporaryDirectory() as tmp:
        names = format_patches(repo, Path(tmp))
        known = {p.read_bytes() for p in project.patches_dir.glob("*.patch")}
        series = read_series(project.patches_dir)
        out = [_subject(Path(tmp) / n) for n in names if (Path(tmp) / n).read_bytes() not in known]
        if not out and names != series:
            out = [f"(order or set differs: vendor has {names}, series has {series})"]
        return out


def _subject(path: Path) -> str:
    m = re.search(r"^Subject: (?:\[PATCH\] )?(.*)$", path.read_text(errors="replace"), re.M)
    return m.group(1) if m else path.name


def _am(repo: GitRepo, files: list[Path]) -> None:
    if not files:
        return
    proc = repo.run("am", "-3", "--keep-cr", "--committer-date-is-author-date",
                    *[str(f) for f in files], check=False)
    if proc.returncode != 0:
        output = proc.stdout + proc.stderr
        m = re.search(r"Patch failed at (\d+)", output)
        which = files[int(m.group(1)) - 1].name if m and 0 < int(m.group(1)) <= len(files) else "a patch"
        raise UserError(
            f"git am stopped at {which} in {repo.path}:\n{(proc.stdout + proc.stderr).strip()[-3000:]}\n\n"
            "To resolve: fix the conflicted files there, then\n"
            f"  git -C {repo.path} add -A && git -C {repo.path} am --continue\n"
            "  llama-sparse patches export      # write the resolved stack back to patches/\n"
            "or give up with:\n"
            f"  git -C {repo.path} am --abort"
        )


def series_files(project: Project) -> list[Path]:
    files = []
    for name in read_series(project.patches_dir):
        path = project.patches_dir / name
        if not path.is_file():
            raise UserError(f"patches/{SERIES} names {name}, which does not exist")
        files.append(path)
    return files


def apply(project: Project, discard: bool = False, log=print) -> None:
    repo = GitRepo(project.vendor_dir)
    if not repo.is_repo() or repo.rev(UPSTREAM_TAG) is None:
        raise UserError(f"{project.vendor_dir} is missing; run `llama-sparse vendor` first")
    files = series_files(project)
    head, base = repo.rev("HEAD"), repo.rev(UPSTREAM_TAG)
    dirty = repo.dirty()
    if dirty and not discard:
        raise UserError(f"{project.vendor_dir} has uncommitted changes:\n  " + "\n  ".join(dirty[:10]) +
                        "\ncommit and export them, or pass --discard to throw them away")
    if head != base and not discard:
        unexported = unexported_commits(project)
        if not unexported:
            log(f"patch stack already applied ({len(files)} patches); nothing to do")
            return
        raise UserError(f"{project.vendor_dir} has commits that differ from patches/:\n  " +
                        "\n  ".join(unexported) +
                        "\nrun `llama-sparse patches export` to keep them, or `patches apply --discard`")
    repo.run("am", "--abort", check=False)
    repo.run("reset", "-q", "--hard", UPSTREAM_TAG)
    repo.run("clean", "-q", "-fd", "-e", "build*")
    _am(repo, files)
    log(f"applied {len(files)} patches onto '{UPSTREAM_TAG}'")


def export(project: Project, log=print) -> list[str]:
    repo = GitRepo(project.vendor_dir)
    if repo.dirty():
        raise UserError(f"{project.vendor_dir} has uncommitted changes; commit them first")
    with tempfile.TemporaryDirectory() as tmp:
        names = format_patches(repo, Path(tmp))
        for old in project.patches_dir.glob("*.patch"):
            old.unlink()
        for n in names:
            shutil.copyfile(Path(tmp) / n, project.patches_dir / n)
    write_series(project.patches_dir, names)
    log(f"exported {len(names)} patches to {project.patches_dir}")
    return names


@dataclass(frozen=True)
class CheckProblem:
    file: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}"


SUBJECT_MAX = 72
# upstream's form: the component(s) touched, " : ", then what the patch does
_SUBJECT_FORM = re.compile(r"^[a-z0-9][\w.-]*(, [a-z0-9][\w.-]*)* : \S")
STACK_TABLE = Path("docs") / "patches.md"
STACK_HEADING = "## The stack"


def subject_of(path: Path) -> str:
    """A format-patch file's subject, its folded lines joined, without the [PATCH] tag."""
    header = path.read_text(errors="replace").partition("\n\n")[0]
    m = re.search(r"^Subject: (.*(?:\n[ \t].*)*)", header, re.M)
    subject = re.sub(r"\n[ \t]", " ", m.group(1)) if m else ""
    return re.sub(r"^\[PATCH[^\]]*\] ", "", subject)


def lint_subject(path: Path) -> list[CheckProblem]:
    subject = subject_of(path)
    problems = []
    if len(subject) > SUBJECT_MAX:
        problems.append(CheckProblem(path.name, f"subject of {len(subject)} characters (at most {SUBJECT_MAX})"))
    if not _SUBJECT_FORM.match(subject):
        problems.append(CheckProblem(path.name, f"subject {subject!r} is not in upstream's form "
                                                "('ggml : add ...', 'llama : ...', 'llama, server : ...')"))
    return problems


def lint_concerns(project: Project, series: list[str]) -> list[CheckProblem]:
    """Every patch is a concern the design names: docs/patches.md's stack table lists each patch
    of the series, in its order, and no other. A change to a concern an existing patch holds is
    folded into that patch; a patch stacked on top has no line there and is refused until it is
    folded, or its concern is written into the design."""
    doc = project.root / STACK_TABLE
    if not doc.is_file():
        return [CheckProblem(str(STACK_TABLE), "missing: it names the concern of every patch")]
    text = doc.read_text()
    section = text.split(STACK_HEADING, 1)[1].split("\n## ", 1)[0] if STACK_HEADING in text else ""
    listed = re.findall(r"^\| `([^`]+\.patch)` \|", section, re.M)
    problems = [CheckProblem(name, f"has no concern in {STACK_TABLE}'s stack table: fold it into the patch "
                                   "whose concern it changes, or name its concern there")
                for name in series if name not in listed]
    problems += [CheckProblem(str(STACK_TABLE), f"lists {name}, which patches/{SERIES} does not")
                 for name in listed if name not in series]
    if not problems and listed != series:
        problems.append(CheckProblem(str(STACK_TABLE), "its stack table is not in the order of patches/series"))
    return problems


def lint_message(path: Path) -> list[CheckProblem]:
    """A patch message must say why (a paragraph after the subject) and where it stands upstream."""
    text = path.read_text(errors="replace")
    header, _, rest = text.partition("\n\n")
    message = re.split(r"(?m)^---$", rest, maxsplit=1)[0]
    problems = []
    if not re.search(r"^Subject: ", header, re.M):
        problems.append(CheckProblem(path.name, "no Subject: header (not a format-patch file)"))
    body = [p for p in message.split("\n\n") if p.strip() and not UPSTREAM_STATUS.search(p)
            and not re.match(r"^[A-Z][\w-]+: ", p.strip())]
    if not body:
        problems.append(CheckProblem(path.name, "message has no paragraph saying why the patch exists"))
    if not UPSTREAM_STATUS.search(message):
        problems.append(CheckProblem(
            path.name, "no 'Upstream-Status: Pending|Submitted <url>|Accepted|Backport|Denied|"
                       "Inappropriate [reason]' trailer"))
    return problems


# What a patch's headers define that a later patch may use: macros, struct/enum tags and
# functions declared with an export macro (new files count too).
_DEFINES = (
    re.compile(r"^\+[ \t]*#[ \t]*define[ \t]+(\w+)", re.M),
    re.compile(r"^\+[ \t]*(?:typedef[ \t]+)?(?:struct|enum)[ \t]+(\w+)[ \t]*\{", re.M),
    re.compile(r"^\+[ \t]*(?:LLAMA_API|GGML_API|GGML_BACKEND_API)\b[^(;\n]*?\b(\w+)[ \t]*\(", re.M),
)
_NEW_FILE = re.compile(r"^--- /dev/null\n\+\+\+ b/(\S+)$", re.M)
_TOUCHED = re.compile(r"^diff --git a/(\S+) b/", re.M)


def _status(text: str) -> str | None:
    m = UPSTREAM_STATUS.search(re.split(r"(?m)^---$", text, maxsplit=1)[0])
    return m.group(1) if m else None


def lint_status_order(files: list[Path]) -> list[CheckProblem]:
    """A Pending patch must be proposable with the Pending patches before it: it may not use a
    file, macro, type or exported function that an Inappropriate patch before it added."""
    problems = []
    our_names: dict[str, str] = {}  # what Inappropriate patches' headers define -> the patch
    our_files: dict[str, str] = {}  # the files they create -> the patch
    for path in files:
        text = path.read_text(errors="replace")
        status = _status(text) or ""
        start = text.find("\ndiff --git ")
        diff = text[start + 1:] if start >= 0 else ""
        if status == "Pending":
            added = "\n".join(l[1:] for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++"))
            used = sorted([(n, p) for n, p in our_names.items() if re.search(rf"\b{re.escape(n)}\b", added)] +
                          [(f, our_files[f]) for f in _TOUCHED.findall(diff) if f in our_files])
            for name, source in used:
                problems.append(CheckProblem(
                    path.name, f"is Upstream-Status: Pending but uses {name}, which {source} "
                               "(Inappropriate) adds: mark it Inappropriate too, or move what it needs "
                               "into a Pending patch"))
        elif status.startswith("Inappropriate"):
            # only what a header declares: a .cpp's own structs and macros are nobody else's
            for section in re.split(r"(?m)^(?=diff --git )", diff):
                header = re.match(r"diff --git a/(\S+)", section)
                if header and header.group(1).endswith((".h", ".hpp", ".cuh")):
                    for rx in _DEFINES:
                        for name in rx.findall(section):
                            our_names.setdefault(name, path.name)
            for f in _NEW_FILE.findall(diff):
                our_files.setdefault(f, path.name)
    return problems


def _compare_with_vendor(project: Project, vendor: GitRepo, _: Path | None) -> list[CheckProblem]:
    """patches/ must also be what the vendor tree's commits export to, when it holds them.

    The round trip cannot see an edit to a message or header (it carries through am and
    format-patch unchanged); the commits in vendor/llama.cpp can.
    """
    if vendor.rev("HEAD") == vendor.rev(UPSTREAM_TAG):
        return []
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        names = format_patches(vendor, Path(tmp))
        for n in names:
            mine = project.patches_dir / n
            if not mine.is_file():
                problems.append(CheckProblem(n, "is a commit in vendor/llama.cpp but not in patches/: export it"))
            elif mine.read_bytes() != (Path(tmp) / n).read_bytes():
                problems.append(CheckProblem(n, "differs from its commit in vendor/llama.cpp: make the change "
                                                "there and export, or `patches apply --discard` to take patches/"))
        for n in sorted(set(read_series(project.patches_dir)) - set(names)):
            problems.append(CheckProblem(n, "is in patches/ but not applied in vendor/llama.cpp: "
                                            "run `llama-sparse patches apply`"))
    return problems


def check(project: Project, log=print) -> list[CheckProblem]:
    """Re-apply the stack on a fresh copy of upstream, re-export, byte-compare with patches/."""
    vendor = GitRepo(project.vendor_dir)
    if not vendor.is_repo() or vendor.rev(UPSTREAM_TAG) is None:
        raise UserError(f"{project.vendor_dir} is missing; run `llama-sparse vendor` first")
    problems: list[CheckProblem] = []
    series = read_series(project.patches_dir)
    on_disk = sorted(p.name for p in project.patches_dir.glob("*.patch"))
    for name in sorted(set(on_disk) - set(series)):
        problems.append(CheckProblem(name, f"not listed in patches/{SERIES}"))
    files = series_files(project)
    for f in files:
        problems += lint_message(f) + lint_subject(f)
    problems += lint_status_order(files)
    problems += lint_concerns(project, series)

    with tempfile.TemporaryDirectory(prefix="llama-sparse-check-") as tmp:
        fresh = GitRepo(Path(tmp) / "tree")
        # --shared borrows the vendor repo's objects: a clean upstream checkout in seconds.
        GitRepo(Path(tmp)).run("clone", "-q", "--shared", "--no-checkout", str(project.vendor_dir), "tree")
        fresh.run("checkout", "-q", "-B", "check", UPSTREAM_TAG)
        try:
            _am(fresh, files)
        except UserError as e:
            return problems + [CheckProblem("series", f"does not apply on a clean upstream:\n{e}")]
        out = Path(tmp) / "export"
        names = format_patches(fresh, out)
        if names != series:
            problems.append(CheckProblem(SERIES, f"re-export gives {names}, series lists {series}"))
        for n in names:
            mine = project.patches_dir / n
            if mine.is_file() and mine.read_bytes() != (out / n).read_bytes():
                problems.append(CheckProblem(n, "differs from its re-export (not byte-stable: "
                                                "run `llama-sparse patches export`)"))
        problems += _compare_with_vendor(project, vendor, out if names else None)
    log(f"checked {len(files)} patches: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return problems
