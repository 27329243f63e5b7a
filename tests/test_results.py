"""docs/results: publishing a run as its gate's current report, the index, the README's table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llama_sparse import results
from llama_sparse.errors import UserError
from llama_sparse.gates.output import write
from llama_sparse.gates.report import ArmResult, GateReport
from llama_sparse.gates.spec import load
from llama_sparse.project import Project

PATCHED = "llama-sparse 0.1.0 (patch set {}, 37 patches) over upstream llama.cpp 0c1e57098bba"
MACHINE = {"hostname": "vm", "cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "cores_usable": 2}


def _spec(gates: Path, name: str, body: dict):
    gates.mkdir(exist_ok=True)
    path = gates / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return load(path)


def _ab_spec(gates: Path):
    return _spec(gates, results.SPEED_GATE, {
        "kind": "ab", "description": "defaults at 8K", "models": ["smollm2-135m"], "context_lengths": [8192],
        "cache_types": ["f16", "q8_0"], "repeats": 5,
        "arms": ["dense", {"name": "default", "flags": ["--sparse-attn", "on"]},
                 {"name": "scsa", "flags": ["--sparse-attn", "scsa"]}]})


def _niah_spec(gates: Path):
    return _spec(gates, results.NEEDLE_GATE, {
        "kind": "niah", "description": "defaults on prose", "models": ["smollm2-135m"],
        "context_lengths": [4096, 7168], "samples": 3, "tasks": ["niah_multikey_1"],
        "arms": ["dense", {"name": "sparse", "flags": ["--sparse-attn", "on"]},
                 {"name": "scsa", "flags": ["--sparse-attn", "scsa"]}]})


def _speed(arm: str, cache: str, ratio: float) -> ArmResult:
    return ArmResult(arm=arm, model="smollm2-135m", context=8192, cache_type=cache, passed=True,
                     metrics={"ratio_median": ratio, "ratio_min": ratio - 0.1, "ratio_max": ratio + 0.1})


def _needles(arm: str, context: int, scores: list[float]) -> ArmResult:
    samples = [{"task": "niah_multikey_1", "index": i, "score": s, "depth": 0.5, "output": "x", "expected": ["y"]}
               for i, s in enumerate(scores)]
    return ArmResult(arm=arm, model="smollm2-135m", context=context, cache_type="f16", samples=samples, passed=True,
                     metrics={"niah": sum(scores) / len(scores)})


def _report(spec, started: str, patch_set: str, rows: list[ArmResult]) -> GateReport:
    return GateReport(spec=spec, started=started, finished=started, machine=MACHINE,
                      builds={"patched": {"llama_sparse": PATCHED.format(patch_set)}}, results=rows, passed=True)


def _run(tmp: Path, name: str, report: GateReport) -> Path:
    run = tmp / "runs" / name
    write(report, run)
    return run


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, Path]:
    docs = tmp_path / "docs-results"
    docs.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(f"# project\n\nintro\n\n{results.TABLE_BEGIN}\nold\n{results.TABLE_END}\n\nmore\n")
    return {"tmp": tmp_path, "gates": tmp_path / "gates", "docs": docs, "readme": readme}


def _publish_both(repo: dict[str, Path], scsa_q8: float = 1.9, lost_at_7k: bool = True) -> None:
    ab = _report(_ab_spec(repo["gates"]), "2026-12-06T06:00:00+0000", "aaaaaaaaaaaa",
                 [_speed("dense", "f16", 1.0), _speed("default", "f16", 4.62), _speed("scsa", "f16", 3.5),
                  _speed("dense", "q8_0", 1.0), _speed("default", "q8_0", 1.79), _speed("scsa", "q8_0", scsa_q8)])
    niah = _report(_niah_spec(repo["gates"]), "2026-12-06T07:00:00+0000", "aaaaaaaaaaaa",
                   [_needles("dense", 4096, [1, 1, 0]), _needles("sparse", 4096, [1, 1, 1]),
                    _needles("scsa", 4096, [1, 0, 0]),
                    _needles("dense", 7168, [1, 0, 1]), _needles("sparse", 7168, [1, 0, 0 if lost_at_7k else 1]),
                    _needles("scsa", 7168, [1, 0, 1])])
    results.publish(_run(repo["tmp"], "ab", ab), repo["docs"], repo["gates"])
    results.publish(_run(repo["tmp"], "niah", niah), repo["docs"], repo["gates"])


def test_publish_names_the_report_and_removes_the_gates_earlier_one(repo) -> None:
    spec = _ab_spec(repo["gates"])
    older = _report(spec, "2026-12-01T10:00:00+0000", "111111111111", [_speed("dense", "f16", 1.0)])
    newer = _report(spec, "2026-12-06T10:00:00+0000", "222222222222",
                    [_speed("dense", "f16", 1.0), _speed("default", "f16", 4.0)])
    results.publish(_run(repo["tmp"], "older", older), repo["docs"], repo["gates"])
    assert (repo["docs"] / "ab-defaults-2026-12-01-111111111111.json").is_file()
    written = results.publish(_run(repo["tmp"], "newer", newer), repo["docs"], repo["gates"])
    names = sorted(p.name for p in repo["docs"].iterdir())
    assert names == ["README.md", "ab-defaults-2026-12-06-222222222222.json",
                     "ab-defaults-2026-12-06-222222222222.md", "ab-defaults-2026-12-06-222222222222.png"]
    assert repo["docs"] / "README.md" in written
    index = (repo["docs"] / "README.md").read_text()
    assert "| `ab-defaults` | ab | PASS | 2026-12-06 | 222222222222 | Intel Xeon Processor, 2 cores |" in index
    assert "decode at 8K against dense, f16: default 4.00x" in index


def test_publish_refuses_a_run_that_has_not_finished(repo) -> None:
    report = _report(_ab_spec(repo["gates"]), "2026-12-06T10:00:00+0000", "222222222222", [])
    report.finished = None
    with pytest.raises(UserError, match="has not finished"):
        results.publish(_run(repo["tmp"], "running", report), repo["docs"], repo["gates"])
    assert list(repo["docs"].iterdir()) == []


def test_index_names_the_gates_without_a_report(repo) -> None:
    _spec(repo["gates"], "niah-prose", {"kind": "niah", "models": ["smollm2-135m"], "context_lengths": [4096],
                                       "tasks": ["niah_multikey_1"], "arms": ["dense"]})
    _publish_both(repo)
    index = results.index(repo["docs"], repo["gates"])
    assert "Gates in `gates/` with no report here: `niah-prose`." in index
    assert "needles dense finds, kept: sparse 3 of 4, scsa 3 of 4" in index


def test_readme_table_is_read_from_the_reports(repo) -> None:
    _publish_both(repo)
    table = results.readme_table(repo["docs"])
    assert table.startswith(results.TABLE_BEGIN) and table.endswith(results.TABLE_END)
    on = next(line for line in table.splitlines() if line.startswith("| `--sparse-attn on`"))
    scsa = next(line for line in table.splitlines() if line.startswith("| `--sparse-attn scsa`"))
    # dense found 2 at 4K and 2 at 7K; sparse lost one at 7K, scsa one at 4K
    assert on.endswith("| 3 of 4 | 4.62x (4.52-4.72) | 1.79x (1.69-1.89) |")
    assert scsa.endswith("| 3 of 4 | 3.50x (3.40-3.60) | 1.90x (1.80-2.00) |")
    assert "gate `ab-defaults` (2026-12-06, Intel Xeon Processor, 2 cores, patch set aaaaaaaaaaaa)" in table


def test_check_fails_when_the_readme_and_the_reports_disagree(repo) -> None:
    _publish_both(repo)
    assert any("README.md: its table differs" in p for p in results.stale(repo["readme"], repo["docs"], repo["gates"]))
    repo["readme"].write_text(results.readme_with_table(repo["readme"], repo["docs"]))
    assert results.stale(repo["readme"], repo["docs"], repo["gates"]) == []
    assert repo["readme"].read_text().startswith("# project\n\nintro\n\n") and "\n\nmore\n" in repo["readme"].read_text()
    _publish_both(repo, scsa_q8=2.5, lost_at_7k=False)     # a new run of both gates, other figures
    stale = results.stale(repo["readme"], repo["docs"], repo["gates"])
    assert stale == [f"{repo['readme']}: its table differs from the reports (`llama-sparse results table --write`)"]


def test_check_names_a_report_whose_file_name_is_not_its_gate_date_and_patch_set(repo) -> None:
    _publish_both(repo)
    repo["readme"].write_text(results.readme_with_table(repo["readme"], repo["docs"]))
    for suffix in (".md", ".json", ".png"):
        src = repo["docs"] / f"ab-defaults-2026-12-06-aaaaaaaaaaaa{suffix}"
        src.rename(repo["docs"] / f"ab-defaults-xeon{suffix}")
    stale = results.stale(repo["readme"], repo["docs"], repo["gates"])
    assert any("named ab-defaults-xeon, its gate, date and patch set say ab-defaults-2026-12-06-aaaaaaaaaaaa" in p
               for p in stale)


def test_answers_no_verdict_read_are_not_counted(repo) -> None:
    """A run cut short keeps the answers of its last prompts unscored: the table counts only
    the scored results, and names only the contexts they cover."""
    _publish_both(repo)
    run = repo["tmp"] / "runs" / "niah"
    from llama_sparse.gates.output import load
    report = load(run)
    for r in report.results:
        if r.context == 7168:
            r.metrics = {}
    results.publish(_run(repo["tmp"], "niah-cut", report), repo["docs"], repo["gates"])
    table = results.readme_table(repo["docs"])
    assert "kept (4K) |" in table
    on = next(line for line in table.splitlines() if line.startswith("| `--sparse-attn on`"))
    assert "| 2 of 2 |" in on      # 4K only: dense found 2, sparse kept both


def test_table_says_which_gate_to_run_when_a_report_is_missing(repo) -> None:
    with pytest.raises(UserError, match="no report of gate `ab-defaults`; run `llama-sparse gate gates/ab-defaults.yaml`"):
        results.readme_table(repo["docs"])


def test_the_repositorys_readme_table_and_index_agree_with_its_reports() -> None:
    project = Project.find()
    assert results.stale(project.root / "README.md", project.root / "docs" / "results", project.root / "gates") == []
