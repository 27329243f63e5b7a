"""`llama-sparse build`: drive the top-level CMakeLists.txt into build/<variant>, incrementally.

`--upstream` builds the unpatched `upstream` tag with the same build definition: the identity
gate compares the two. Its worktree and build folder sit at the same relative places as the
patched ones (build/upstream/vendor/llama.cpp built in build/upstream/build/upstream, like
vendor/llama.cpp built in build/patched), so with CCACHE_BASEDIR every file our patches do
not touch compiles to a ccache hit and the second build takes a fraction of the first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.gitrepo import GitRepo
from llama_sparse.project import UPSTREAM_TAG, Project

DEFAULT_TARGETS = ("llama-server", "llama-cli", "llama-bench", "test-backend-ops", "ggml-rpc-server",
                   "llama-sparse-logits", "llama-sparse-cachecheck", "llama-sparse-scsa-test",
                   "llama-sparse-scsa-bench", "llama-sparse-rpccheck")
# tools that call the patched API, so the unpatched (identity gate) build leaves them out
PATCHED_ONLY_TARGETS = ("llama-sparse-cachecheck", "llama-sparse-scsa-test", "llama-sparse-scsa-bench",
                        "llama-sparse-rpccheck")


@dataclass
class BuildConfig:
    variant: str = "patched"          # or "upstream"
    targets: tuple[str, ...] = DEFAULT_TARGETS
    jobs: int = 2
    cuda: bool = False
    build_type: str = "Release"
    extra_defines: dict[str, str] = field(default_factory=dict)


def upstream_worktree(project: Project) -> Path:
    """An unpatched checkout of the `upstream` tag, kept in step with the tag."""
    vendor = GitRepo(project.vendor_dir)
    if vendor.rev(UPSTREAM_TAG) is None:
        raise UserError(f"{project.vendor_dir} is missing; run `llama-sparse vendor` first")
    path = upstream_root(project) / "vendor" / "llama.cpp"
    tree = GitRepo(path)
    if path.exists() and tree.is_repo():
        if tree.rev("HEAD") == vendor.rev(UPSTREAM_TAG) and not tree.dirty():
            return path
        raise UserError(f"{path} is not a clean checkout of '{UPSTREAM_TAG}'; remove it "
                        f"(`git -C {project.vendor_dir} worktree remove --force {path}`) and run again")
    vendor.run("worktree", "prune")
    vendor.run("worktree", "add", "-q", "--detach", str(path), UPSTREAM_TAG)
    return path


def upstream_root(project: Project) -> Path:
    return project.build_dir / "upstream"


def build_dir(project: Project, variant: str) -> Path:
    if variant == "upstream":
        return upstream_root(project) / "build" / "upstream"
    return project.build_dir / variant


def bin_dir(project: Project, variant: str = "patched") -> Path:
    return build_dir(project, variant) / "bin"


def build(project: Project, cfg: BuildConfig, log=print) -> Path:
    if cfg.variant == "upstream":
        source = upstream_worktree(project)
    else:
        source = project.vendor_dir
        if not (source / "CMakeLists.txt").is_file():
            raise UserError(f"{source} is missing; run `llama-sparse vendor && llama-sparse patches apply`")
    out = build_dir(project, cfg.variant)
    defines = {
        "CMAKE_BUILD_TYPE": cfg.build_type,
        "LLAMA_SPARSE_SOURCE_DIR": str(source),
        "LLAMA_SPARSE_VARIANT": cfg.variant,
        "LLAMA_SPARSE_CUDA": "ON" if cfg.cuda else "OFF",
        **cfg.extra_defines,
    }
    generator, launchers, env = toolchain(project, out, cuda=cfg.cuda)
    defines.update(launchers)
    configure = ["cmake", "-S", str(project.root), "-B", str(out), *generator,
                 *[f"-D{k}={v}" for k, v in defines.items()]]
    log(f"configuring {cfg.variant} build in {out}")
    _run(configure, env, "cmake configure")
    targets = [t for t in cfg.targets if cfg.variant == "patched" or t not in PATCHED_ONLY_TARGETS]
    log(f"building {', '.join(targets)} with {cfg.jobs} jobs")
    _run(["cmake", "--build", str(out), "-j", str(cfg.jobs), "--target", *targets], env, "cmake build")
    return out / "bin"


def toolchain(project: Project, out: Path, cuda: bool = False) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """What every build here is configured with: Ninja when present (unless `out` was configured
    with Makefiles), ccache as the compiler launcher when present, and the environment that lets
    ccache share hits between build folders. Returns (generator args, defines, environment)."""
    launchers: dict[str, str] = {}
    if shutil.which("ccache"):
        launchers["CMAKE_C_COMPILER_LAUNCHER"] = launchers["CMAKE_CXX_COMPILER_LAUNCHER"] = "ccache"
        if cuda:
            launchers["CMAKE_CUDA_COMPILER_LAUNCHER"] = "ccache"
    generator = ["-G", "Ninja"] if shutil.which("ninja") and not (out / "Makefile").exists() else []
    return generator, launchers, {**os.environ, "CCACHE_BASEDIR": str(project.root)}


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        raise UserError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}")
