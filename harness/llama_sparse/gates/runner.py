"""Running a gate: one results folder, one report written after every result, errors kept.

Each kind of gate is a module with `run(ctx: GateContext)`; this module gives them what they
share: the arms to run, the server configuration of an arm, model paths, the progress display,
and `record`, which writes the report to disk at once so that a server dying later leaves
everything measured so far behind.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llama_sparse import models
from llama_sparse.binaries import binary
from llama_sparse.errors import UserError
from llama_sparse.gates import report as reports
from llama_sparse.gates.spec import Arm, GateSpec
from llama_sparse.progress import Progress
from llama_sparse.server import ServerConfig
from llama_sparse.vendor import sha256_file


@dataclass
class GateContext:
    spec: GateSpec
    out_dir: Path
    progress: Progress
    only: tuple[str, ...] = ()                  # arm names to run (with the reference); empty: all
    report: reports.GateReport = field(init=False)
    _model_paths: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.report = reports.GateReport(spec=self.spec, started=reports.now(), machine=reports.machine_info())

    @property
    def arms(self) -> list[Arm]:
        if not self.only:
            return list(self.spec.arms)
        return [a for a in self.spec.arms if a.name in self.only or a is self.spec.reference]

    def model_path(self, name: str) -> Path:
        if name not in self._model_paths:
            path = models.resolve(name, log=self.progress.log)
            self._model_paths[name] = path
            self.report.models[name] = {"path": str(path), "sha256": sha256_file(path)}
        return self._model_paths[name]

    def build_info(self, variant: str) -> None:
        if variant in self.report.builds:
            return
        exe = binary("llama-server", variant)
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
        lines = (out.stdout + out.stderr).strip().splitlines()
        info = {"binary": str(exe), "version": next((ln for ln in lines if ln.startswith("version:")), "")}
        patched = next((ln for ln in lines if ln.startswith("patched: ")), None)
        info["llama_sparse"] = patched[len("patched: "):] if patched else None
        self.report.builds[variant] = info

    def server_config(self, arm: Arm, model: str, ctx_size: int, cache_type: str,
                      parallel: int = 1) -> ServerConfig:
        self.build_info(arm.variant)
        return ServerConfig(model=self.model_path(model), ctx_size=ctx_size, parallel=parallel,
                            threads=self.spec.threads, cache_type_k=cache_type, cache_type_v=cache_type,
                            seed=self.spec.seed, extra_args=list(arm.flags), variant=arm.variant,
                            env=dict(arm.env))

    def log_path(self, *parts: object) -> Path:
        return self.out_dir / "logs" / ("-".join(str(p) for p in parts) + ".log")

    def record(self, result: reports.ArmResult) -> None:
        self.report.results.append(result)
        self.save()

    def save(self) -> dict[str, Path]:
        return reports.write(self.report, self.out_dir)



def kind_module(kind: str):
    from llama_sparse.gates import ab, frontier, identity, load, logits, needles

    modules = {"identity": identity, "logits": logits, "niah": needles, "ab": ab, "load": load,
               "frontier": frontier}
    if kind not in modules:
        raise UserError(f"no runner for gate kind '{kind}'")
    return modules[kind]


def run_gate(spec: GateSpec, out_root: Path, only: str | Sequence[str] | None = None, out_dir: Path | None = None,
             progress: Progress | None = None) -> GateContext:
    """`only`: an arm name or several; those arms run with the reference arm, in the file's order."""
    only = (only,) if isinstance(only, str) else tuple(only or ())
    unknown = [name for name in only if name not in {a.name for a in spec.arms}]
    if unknown:
        raise UserError(f"{spec.path}: no arm named '{unknown[0]}'; arms: {', '.join(a.name for a in spec.arms)}")
    directory = out_dir or reports.run_dir(out_root, spec.name)
    with (progress or Progress()) as p:
        ctx = GateContext(spec=spec, out_dir=directory, progress=p, only=only)
        p.log(f"gate {spec.name} ({spec.kind}): results in {directory}")
        try:
            kind_module(spec.kind).run(ctx)
        finally:
            ctx.report.finished = reports.now()
            ctx.save()
    return ctx
