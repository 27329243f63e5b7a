"""Every gate's verdict, one way: each result against its kind's thresholds.

A kind's run only measures (metrics, samples, errors); `judge` decides. A threshold in force
(set in the gate file, or a default of the kind) judges every result that carries its metric,
the dense arms excepted for a `sparse_only` one. A result passes when every threshold that
judged it holds, fails when one does not, and is unjudged (None) when none applies. An error is
never a score: an errored result fails. The gate fails when any result failed or errored, and
passes otherwise; a finished run that measured nothing fails.
"""

from __future__ import annotations

from typing import Any

from llama_sparse.gates.schema import Kind


def limits(kind: Kind, thresholds: dict[str, float]) -> dict[str, float]:
    """The thresholds in force: the gate file's, else the kind's defaults."""
    out = {}
    for name, t in kind.thresholds.items():
        value = thresholds.get(name, t.default) if t.settable else t.default
        if value is not None:
            out[name] = value
    return out


def judge_result(result: Any, kind: Kind, in_force: dict[str, float], sparse: bool) -> bool | None:
    if result.error is not None:
        return False
    verdicts = []
    for name, limit in in_force.items():
        t = kind.thresholds[name]
        if t.metric not in result.metrics or (t.sparse_only and not sparse):
            continue
        verdicts.append(t.passes(result.metrics[t.metric], limit))
    return all(verdicts) if verdicts else None


def judge(report: Any, kind: Kind, final: bool = False) -> bool | None:
    """Sets `passed` on every result of `report` (a GateReport) and on the report; returns it."""
    in_force = limits(kind, report.spec.thresholds)
    sparse = {a.name: a.sparse for a in report.spec.arms}
    for r in report.results:
        r.passed = judge_result(r, kind, in_force, sparse.get(r.arm, False))
    if not report.results:
        report.passed = False if final else None
    else:
        report.passed = all(r.passed is not False for r in report.results)
    return report.passed
