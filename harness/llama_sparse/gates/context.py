"""What a running gate's kind works with: the arms to run, the server configuration of an arm,
model paths, the progress display, and `record`, which judges and writes the report at once so
that a server dying later leaves everything measured so far behind."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from llama_sparse import models
from llama_sparse.binaries import binary
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

    def save(self, final: bool = False) -> dict[str, Path]:
        """Judge every result so far by the kind's thresholds (`final`: the run is over) and write
        the report."""
        if self.kind is not None:
            judge(self.report, self.kind, final=final)
        return output.write(self.report, self.out_dir)
