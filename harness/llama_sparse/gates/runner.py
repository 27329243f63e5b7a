"""Running a gate: one results folder, one report written after every result, errors kept.

Each kind of gate is a module that declares its `Kind` (gates.kinds): its run function records
results through the `GateContext`; the verdict is computed by `verdict.judge` after every
result and once more when the run is over.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.gates import output, report as reports
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.kinds import KINDS
from llama_sparse.gates.schema import GateSpec, Kind
from llama_sparse.progress import Progress

__all__ = ["GateContext", "kind_of", "render", "run_gate"]


def kind_of(name: str) -> Kind:
    if name not in KINDS:
        raise UserError(f"no runner for gate kind '{name}'")
    return KINDS[name]


def run_gate(spec: GateSpec, out_root: Path, only: str | Sequence[str] | None = None, out_dir: Path | None = None,
             progress: Progress | None = None) -> GateContext:
    """`only`: an arm name or several; those arms run with the reference arm, in the file's order."""
    only = (only,) if isinstance(only, str) else tuple(only or ())
    unknown = [name for name in only if name not in {a.name for a in spec.arms}]
    if unknown:
        raise UserError(f"{spec.path}: no arm named '{unknown[0]}'; arms: {', '.join(a.name for a in spec.arms)}")
    kind = kind_of(spec.kind)
    directory = out_dir or output.run_dir(out_root, spec.name)
    with (progress or Progress()) as p:
        ctx = GateContext(spec=spec, out_dir=directory, progress=p, kind=kind, only=only)
        p.log(f"gate {spec.name} ({spec.kind}): results in {directory}")
        try:
            kind.run(ctx)
        except BaseException as e:  # an interrupt too: the report must not read as a finished run
            ctx.report.cut_short = type(e).__name__ + (f": {e}" if str(e) else "")
            raise
        finally:
            ctx.report.finished = reports.now()
            ctx.save(final=True)
    return ctx


def render(out_dir: Path) -> dict[str, Path]:
    """report.md and plot.png of an earlier run drawn again from its report.json (its verdict is
    the one it was given then)."""
    report = output.load(out_dir)
    report.kind = KINDS.get(report.spec.kind)
    return output.write(report, Path(out_dir))
