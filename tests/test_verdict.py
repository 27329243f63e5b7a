"""Every kind's thresholds are enforced, one way (gates.verdict.judge), and the harness has no
import circle. No server needed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from llama_sparse.gates.kinds import KINDS
from llama_sparse.gates.report import ArmResult, GateReport
from llama_sparse.gates.spec import load
from llama_sparse.gates.verdict import judge

HARNESS = Path(__file__).resolve().parent.parent / "harness"
SPARSE = {"name": "sparse", "flags": ["--sparse-attn", "on"]}


def report_of(tmp_path: Path, kind: str, thresholds: dict, *results: ArmResult) -> GateReport:
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump({"kind": kind, "models": ["smollm2-135m"], "context_lengths": [4096],
                                    "arms": ["dense", SPARSE], "thresholds": thresholds}))
    return GateReport(spec=load(path), started="s", results=list(results))


def result(arm: str, **metrics: float) -> ArmResult:
    return ArmResult(arm=arm, model="smollm2-135m", context=4096, cache_type="f16", metrics=dict(metrics))


# (kind, thresholds, the sparse arm's metrics that meet them, a metric that breaks them)
CASES = [
    ("identity", {}, {"diff_prompts": 0.0}, {"diff_prompts": 1.0}),           # max_diff_prompts 0 by default
    ("identity", {"max_diff_prompts": 1}, {"diff_prompts": 1.0}, {"diff_prompts": 2.0}),
    ("logits", {"min_top1": 0.97}, {"top1": 0.97}, {"top1": 0.96}),
    ("logits", {"max_kl_mean": 0.01}, {"kl_mean": 0.01}, {"kl_mean": 0.02}),
    ("logits", {"max_kl_max": 0.5}, {"kl_max": 0.5}, {"kl_max": 0.6}),
    ("logits", {"max_diff_steps": 0}, {"diff_steps": 0.0}, {"diff_steps": 3.0}),
    ("niah", {"min_score": 1.0}, {"niah": 1.0}, {"niah": 23 / 24}),
    ("niah", {"max_lost": 0}, {"lost_vs_reference": 0.0}, {"lost_vs_reference": 1.0}),
    ("niah", {}, {"lost_under_load": 0.0}, {"lost_under_load": 1.0}),       # a rule of the kind
    ("niah", {}, {"rechecks_changed_under_load": 0.0}, {"rechecks_changed_under_load": 1.0}),
    ("niah", {}, {"changed_beyond_reference": 0.0}, {"changed_beyond_reference": 1.0}),
    ("ab", {"min_ratio": 1.5}, {"ratio_median": 1.5}, {"ratio_median": 1.49}),
    ("ttft", {"min_ratio": 2.0}, {"ratio_median": 2.0}, {"ratio_median": 1.99}),
    ("ttft", {"min_agree_tokens": 8}, {"agree_tokens_min": 8.0}, {"agree_tokens_min": 7.0}),
    ("ab", {"min_bound_share": 0.8}, {"bound_share": 0.8}, {"bound_share": 0.79}),
    ("load", {}, {"http_5xx": 0.0, "parse_errors": 0.0}, {"http_5xx": 1.0}),
    ("load", {}, {"timing_lines_missing": 0.0}, {"timing_lines_missing": 2.0}),
    ("load", {}, {"not_sent": 0.0}, {"not_sent": 5.0}),
    ("load", {}, {"lost_under_load": 0.0, "http_other_errors": 0.0}, {"http_other_errors": 1.0}),
    ("load", {}, {"parse_errors": 0.0}, {"parse_errors": 1.0}),
    ("load", {}, {"lost_under_load": 0.0}, {"lost_under_load": 1.0}),
]


@pytest.mark.parametrize("kind, thresholds, good, bad", CASES)
def test_each_kind_enforces_its_thresholds(tmp_path: Path, kind: str, thresholds: dict, good: dict, bad: dict) -> None:
    dense = result("dense")
    met = report_of(tmp_path, kind, thresholds, dense, result("sparse", **good))
    assert judge(met, KINDS[kind], final=True) is True and met.results[1].passed is True
    broken = report_of(tmp_path, kind, thresholds, dense, result("sparse", **{**good, **bad}))
    assert judge(broken, KINDS[kind], final=True) is False and broken.results[1].passed is False


def test_every_threshold_of_every_kind_is_in_a_case() -> None:
    covered = {(kind, t.metric) for kind, _t, _good, bad in CASES for t in KINDS[kind].thresholds.values()
               if t.metric in bad}
    declared = {(kind, t.metric) for kind, k in KINDS.items() for t in k.thresholds.values()}
    assert declared - covered == set()


def test_a_sparse_only_threshold_does_not_judge_dense(tmp_path: Path) -> None:
    # dense's ratio to itself is 1.0: a min_ratio of 1.5 is for the sparse arms
    report = report_of(tmp_path, "ab", {"min_ratio": 1.5}, result("dense", ratio_median=1.0),
                       result("sparse", ratio_median=2.0))
    assert judge(report, KINDS["ab"]) is True and report.results[0].passed is None


def test_errors_and_empty_runs_fail_and_no_threshold_is_no_verdict_on_a_result(tmp_path: Path) -> None:
    died = result("sparse", ratio_median=9.0).fail("server died")
    report = report_of(tmp_path, "ab", {}, result("dense", ratio_median=1.0), died)
    assert judge(report, KINDS["ab"]) is False and died.passed is False
    report = report_of(tmp_path, "ab", {}, result("dense", ratio_median=1.0), result("sparse", ratio_median=0.5))
    assert judge(report, KINDS["ab"]) is True and [r.passed for r in report.results] == [None, None]
    empty = report_of(tmp_path, "niah", {})
    assert judge(empty, KINDS["niah"]) is None and judge(empty, KINDS["niah"], final=True) is False


def test_a_rule_of_a_kind_cannot_be_set_from_a_gate_file(tmp_path: Path) -> None:
    from llama_sparse.gates.spec import SpecError

    path = tmp_path / "load.yaml"
    path.write_text(yaml.safe_dump({"kind": "load", "models": ["smollm2-135m"], "context_lengths": [2048],
                                    "arms": ["dense"], "thresholds": {"max_http_5xx": 3}}))
    with pytest.raises(SpecError, match="'max_http_5xx' unknown for kind load"):
        load(path)


def import_graph() -> dict[str, set[str]]:
    """Module -> the harness modules it imports (anywhere in it, function bodies included)."""
    modules = {".".join(p.relative_to(HARNESS).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (HARNESS / "llama_sparse").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("llama_sparse"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    deps.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("llama_sparse"))
        graph[name] = {d for d in deps if d in modules and d != name and d != "llama_sparse"}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_harness_has_no_import_circle() -> None:
    graph = import_graph()
    assert "llama_sparse.gates.spec" in graph and graph["llama_sparse.gates.kinds"]
    assert cycles(graph) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
