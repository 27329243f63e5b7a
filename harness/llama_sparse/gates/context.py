"""What a running gate's kind works with: the arms to run, the server configuration of an arm,
model paths, the progress display, and `record`, which judges and writes the report at once so
that a server dying later leaves everything measured so far behind."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llama_sparse import models
from llama_sparse.binaries import binary
from llama_sparse.errors import UserError
from llama_sparse.gates import output, report as reports
from llama_sparse.gates.schema import Arm, GateSpec, Kind
from llama_sparse.gates.verdict import judge
from llama_sparse.progress import Progress
from llama_sparse.server import ServerConfig
from llama_sparse.vendor import sha256_file


@dataclass
class GateContext:
    spec: GateSpec
    out_dir: Path
    progress: Progress
    kind: Kind | None = None                    # judges the results and extends the report; None: neither
    only: tuple[str, ...] = ()                  # arm names to run (with the reference); empty: all
    report: reports.GateReport = field(init=False)
    _model_paths: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.report = reports.GateReport(spec=self.spec, started=reports.now(), machine=reports.machine_info(),
                                         kind=self.kind)

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

    def points(self) -> Iterator[tuple[str, int, str]]:
        """Every (model, context length, KV type) the gate measures, in the order it runs them."""
        for model in self.spec.models:
            for n_ctx in self.spec.context_lengths:
                for cache in self.spec.cache_types:
                    yield model, n_ctx, cache

    def dense_arm(self) -> Arm:
        """The arm without sparse flags: a speed gate's ratios are over it."""
        dense = next((a for a in self.arms if not a.sparse), None)
        if dense is None:
            raise UserError(f"{self.spec.path}: a {self.spec.kind} gate needs a dense arm (one without sparse flags)")
        return dense

    def record_speed(self, result: reports.ArmResult, where: str, figure: Callable[[dict[str, float]], str]) -> None:
        """Record a speed gate's result and log it: its figure and its ratio to dense, or its error."""
        self.record(result)
        if result.error is None:
            m = result.metrics
            ratio = f", {m['ratio_median']:.2f}x dense" if "ratio_median" in m else ""
            self.progress.log(f"  {result.arm} {where}: {figure(m)}{ratio}")
        else:
            self.progress.log(f"  {result.arm} {where}: ERROR {result.error.splitlines()[0]}")

    def save(self, final: bool = False) -> dict[str, Path]:
        """Judge every result so far by the kind's thresholds (`final`: the run is over) and write
        the report."""
        if self.kind is not None:
            judge(self.report, self.kind, final=final)
        return output.write(self.report, self.out_dir)
