"""Gate reports on disk (json, markdown, png) and the progress display; no server needed."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import yaml

from llama_sparse.gates.markdown import format_metric, markdown_table
from llama_sparse.gates.output import run_dir, write
from llama_sparse.gates.plot import plot
from llama_sparse.gates.report import ArmResult, GateReport, machine_info
from llama_sparse.gates.spec import load
from llama_sparse.progress import Progress

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def spec(tmp_path: Path):
    path = tmp_path / "ab-test.yaml"
    path.write_text(yaml.safe_dump({
        "kind": "ab", "description": "sparse vs dense", "models": ["smollm2-135m"],
        "context_lengths": [2048, 4096, 8192], "repeats": 5,
        "arms": ["dense", {"name": "sparse-25", "flags": ["--sparse-attn", "on"], "coverage": 0.25}],
    }))
    return load(path)


def speed(arm: str, ctx: int, ratio: float, tps: float) -> ArmResult:
    return ArmResult(arm=arm, model="smollm2-135m", context=ctx, cache_type="f16",
                     metrics={"decode_tps_median": tps, "decode_tps_min": tps - 0.5,
                              "decode_tps_max": tps + 0.5, "ratio_median": ratio,
                              "ratio_min": ratio - 0.1, "ratio_max": ratio + 0.2,
                              "bound": 4.0, "bound_share": ratio / 4.0},
                     samples=[{"repeat": i, "decode_tps": tps} for i in range(5)], passed=True)


def make_report(spec) -> GateReport:
    died = ArmResult(arm="sparse-25", model="smollm2-135m", context=8192, cache_type="f16",
                     samples=[{"repeat": 0, "decode_tps": 3.0}])
    died.metrics = {"ratio_median": 9.9}   # a score measured before the crash must not survive
    died.fail("server died: exit code -9\nlog tail:\nggml_abort: out of memory")
    return GateReport(
        spec=spec, started="2025-01-01T00:00:00+0000", finished="2025-01-01T00:10:00+0000",
        machine=machine_info(),
        builds={"patched": {"build_info": "b1234-abcdef", "llama_sparse": "0.1.0"}},
        models={"smollm2-135m": {"path": "/m/smollm2.gguf", "sha256": "ab" * 32}},
        results=[speed("dense", 2048, 1.0, 20.0), speed("sparse-25", 2048, 2.31, 46.2),
                 speed("sparse-25", 4096, 3.05, 40.1), died],
        passed=True, notes=["dense is the reference"],
    )


def test_write_creates_all_files_and_json_round_trips(tmp_path: Path, spec) -> None:
    report = make_report(spec)
    out = tmp_path / "run"
    paths = write(report, out)
    assert set(paths) == {"json", "md", "png"}
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC
    assert paths["png"].stat().st_size > 1000
    data = json.loads(paths["json"].read_text())
    assert data["gate"] == "ab-test" and data["kind"] == "ab"
    assert data["spec"] == json.loads(json.dumps(spec.to_dict()))
    assert data["builds"]["patched"]["build_info"] == "b1234-abcdef"
    assert data["machine"]["cores"] >= 1
    assert len(data["results"]) == 4
    err = data["results"][3]
    assert err["error"].startswith("server died: exit code -9")
    assert "out of memory" in err["error"]
    assert err["metrics"] == {}                 # no score for an errored arm
    assert err["passed"] is False
    assert err["samples"] == [{"repeat": 0, "decode_tps": 3.0}]
    assert data["results"][1]["metrics"]["ratio_median"] == 2.31
    assert data["results"][1]["samples"][4] == {"repeat": 4, "decode_tps": 46.2}
    assert data["passed"] is False              # an errored arm fails the gate, whatever `passed` says
    assert data["notes"] == ["dense is the reference"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_write_is_repeatable_and_keeps_partial_results(tmp_path: Path, spec) -> None:
    report = GateReport(spec=spec, started="2025-01-01T00:00:00+0000")
    paths = write(report, tmp_path)
    assert "png" not in paths                   # nothing to plot yet
    assert json.loads(paths["json"].read_text())["results"] == []
    assert "incomplete" in paths["md"].read_text()
    report.results.append(speed("dense", 2048, 1.0, 20.0))
    paths = write(report, tmp_path)
    assert len(json.loads(paths["json"].read_text())["results"]) == 1
    assert paths["png"].read_bytes()[:8] == PNG_MAGIC


def test_json_has_no_nan(tmp_path: Path, spec) -> None:
    report = GateReport(spec=spec, started="x", results=[
        ArmResult(arm="dense", model="smollm2-135m", context=2048, cache_type="f16",
                  metrics={"ratio_median": math.nan, "decode_tps_median": math.inf},
                  samples=[{"path": tmp_path, "t": (1, 2)}])])
    text = write(report, tmp_path)["json"].read_text()
    assert "NaN" not in text and "Infinity" not in text
    data = json.loads(text)
    assert data["results"][0]["metrics"] == {"ratio_median": None, "decode_tps_median": None}
    assert data["results"][0]["samples"] == [{"path": str(tmp_path), "t": [1, 2]}]


def test_markdown_table_rows_and_error(spec) -> None:
    md = markdown_table(make_report(spec))
    lines = md.splitlines()
    assert lines[0].startswith("# Gate `ab-test` (ab): FAIL")
    assert "b1234-abcdef" in md
    header = next(line for line in lines if line.startswith("| arm"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[:5] == ["arm", "model", "context", "cache", "B"] and cols[-1] == "result"
    assert "ratio_median" in cols and "decode_tps_median" in cols
    rows = [line for line in lines if line.startswith("| sparse-25") or line.startswith("| dense")]
    assert len(rows) == 4
    ok = [c.strip() for c in rows[1].strip("|").split("|")]
    assert ok[cols.index("ratio_median")] == "2.31x"
    assert ok[cols.index("decode_tps_median")] == "46.2"
    assert ok[cols.index("context")] == "2K"
    assert ok[cols.index("bound_share")] == "57.8%"
    assert ok[-1] == "pass"
    err = [c.strip() for c in rows[3].strip("|").split("|")]
    assert err[-1] == "ERROR: server died: exit code -9"
    assert err[cols.index("ratio_median")] == "-"    # never a score on an error row
    assert "9.9" not in rows[3]
    assert "## Errors" in md and "ggml_abort: out of memory" in md


def test_format_metric() -> None:
    assert format_metric("ratio_median", 2.3112) == "2.31x"
    assert format_metric("decode_tps_min", 14.46) == "14.5"
    assert format_metric("niah", 1.0) == "100%"
    assert format_metric("niah", 23 / 24) == "95.8%"
    assert format_metric("kl_mean", 0.000123456) == "0.000123"
    assert format_metric("diff_steps", 3.0) == "3"
    assert format_metric("anything", None) == "-"


def test_plot_none_without_data(tmp_path: Path, spec) -> None:
    empty = GateReport(spec=spec, started="x")
    assert plot(empty, tmp_path / "p.png") is None
    only_errors = GateReport(spec=spec, started="x", results=[
        ArmResult(arm="dense", model="m", context=1024, cache_type="f16").fail("timed out")])
    assert plot(only_errors, tmp_path / "p.png") is None
    no_plottable = GateReport(spec=spec, started="x", results=[
        ArmResult(arm="dense", model="m", context=1024, cache_type="f16", metrics={"kl_mean": 0.0})])
    assert plot(no_plottable, tmp_path / "p.png") is None
    assert not (tmp_path / "p.png").exists()


def test_plot_niah_panel(tmp_path: Path, spec) -> None:
    report = GateReport(spec=spec, started="x", results=[
        ArmResult(arm="dense", model="smollm2-135m", context=c, cache_type="f16", metrics={"niah": s})
        for c, s in ((1024, 1.0), (7168, 0.95))])
    path = plot(report, tmp_path / "niah.png")
    assert path is not None and path.read_bytes()[:8] == PNG_MAGIC


def test_run_dir_is_fresh(tmp_path: Path) -> None:
    a = run_dir(tmp_path / "results", "niah", when=0)
    b = run_dir(tmp_path / "results", "niah", when=0)
    assert a != b and a.is_dir() and b.is_dir()
    assert a.name.startswith("niah-") and len(a.name) == len("niah-YYYYmmdd-HHMMSS")


def test_machine_info() -> None:
    info = machine_info()
    assert info["hostname"] and info["cpu"] and info["python"] and info["platform"]
    assert info["cores"] >= 1
    json.dumps(info)


# progress.py lives here too: it is what long gate runs report through.

def test_progress_plain_lines() -> None:
    buf = io.StringIO()
    with Progress(stream=buf) as progress:      # a StringIO is no terminal: plain lines
        assert progress.plain
        task = progress.task("prefill 32K", total=3)
        task.advance()
        task.advance(2)
        task.update(description="decode")
        progress.log("a [bracketed] message")
    lines = buf.getvalue().splitlines()
    assert lines[0].endswith("prefill 32K: 0/3")
    assert "prefill 32K: 1/3, about " in lines[1] and lines[1].endswith(" left") and lines[1].lstrip().startswith("[")
    assert "s]" in lines[1]                      # elapsed seconds
    assert lines[2].endswith("prefill 32K: 3/3")
    assert lines[3] == "a [bracketed] message"
    assert len(lines) == 4


def test_progress_plain_time_left_is_the_rate_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("llama_sparse.progress.time.monotonic", lambda: now[0])
    buf = io.StringIO()
    with Progress(stream=buf) as progress:
        task = progress.task("needles", total=5)
        now[0] += 30.0
        task.advance()                           # 30 s for one: four more take about 120 s
        now[0] += 30.0
        task.advance(3)                          # 60 s for four: one more takes about 15 s
    lines = buf.getvalue().splitlines()
    assert lines[1].endswith("needles: 1/5, about 2 min left"), lines[1]
    assert lines[2].endswith("needles: 4/5, about 15 s left"), lines[2]


def test_progress_ci_forces_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert Progress(stream=Tty()).plain is False
    monkeypatch.setenv("CI", "true")
    assert Progress(stream=Tty()).plain is True


def test_progress_rich_mode_and_misuse() -> None:
    buf = io.StringIO()
    with Progress(stream=buf, plain=False) as progress:
        task = progress.task("prefill", total=2)
        task.advance()
        progress.log("hello [bold]x[/bold]")
    assert "hello [bold]x[/bold]" in buf.getvalue()     # printed verbatim, not as markup
    assert "prefill" in buf.getvalue()
    with pytest.raises(RuntimeError):
        Progress(stream=io.StringIO()).task("outside", 1)


def test_calibration_answers_are_listed_apart_from_the_score(spec) -> None:
    r = ArmResult(arm="scsa", model="gemma3-270m", context=16384, cache_type="f16",
                  metrics={"niah": 0.75}, samples=[{"score": 1.0}] * 3 + [{"score": 0.0}],
                  calibration=[{"expected": ["2286618"], "depth": 0.5, "output": ": 2286618.\nThe", "score": 1.0}])
    plain = ArmResult(arm="dense", model="gemma3-270m", context=16384, cache_type="f16", metrics={"niah": 0.5})
    report = GateReport(spec=spec, started="s", results=[plain, r])
    md = markdown_table(report)
    assert "## Calibration questions (answered first, not scored)" in md
    assert "- scsa / 16K: 1 of 1 found (`2286618` at depth 0.50: `: 2286618. The`)\n" in md
    assert "- dense / 16K" not in md
    assert r.to_dict()["calibration"][0]["expected"] == ["2286618"] and "calibration" not in plain.to_dict()


def needle_record(task: str, index: int, found: bool, output: str = "") -> dict:
    return {"task": task, "index": index, "depth": index / 3, "key": "k", "expected": ["1234567"],
            "output": output or ("1234567." if found else "7654321."), "score": 1.0 if found else 0.0}


def test_niah_report_lists_every_needle_against_the_first_arm(tmp_path: Path) -> None:
    path = tmp_path / "niah-prose.yaml"
    path.write_text(yaml.safe_dump({"kind": "niah", "models": ["smollm2-135m"], "context_lengths": [4096],
                                    "tasks": ["niah_multikey_1"], "arms": ["dense", {"name": "quest", "flags": []}]}))
    niah_spec = load(path)
    dense = ArmResult(arm="dense", model="smollm2-135m", context=4096, cache_type="f16", metrics={"niah": 0.5},
                      samples=[needle_record("niah_multikey_1", 0, True), needle_record("niah_multikey_1", 1, False)])
    quest = ArmResult(arm="quest", model="smollm2-135m", context=4096, cache_type="f16", metrics={"niah": 0.5},
                      samples=[needle_record("niah_multikey_1", 0, False, "9999999 | x"),
                               needle_record("niah_multikey_1", 1, True)])
    md = markdown_table(GateReport(spec=niah_spec, started="s", results=[dense, quest]))
    assert "## Needle by needle: smollm2-135m, 4K, f16 (against dense)" in md
    assert "| niah_multikey_1#0 | 0.00 | found | LOST `9999999 \\| x` |" in md
    assert "| niah_multikey_1#1 | 0.33 | `7654321.` | found |" in md


def test_needle_table_shows_the_reference_margin_and_names_thin_needles(tmp_path: Path) -> None:
    path = tmp_path / "niah-prose.yaml"
    path.write_text(yaml.safe_dump({"kind": "niah", "models": ["smollm2-135m"], "context_lengths": [7168],
                                    "tasks": ["niah_multikey_2"], "arms": ["dense", {"name": "on", "flags": []}]}))
    dense = ArmResult(arm="dense", model="smollm2-135m", context=7168, cache_type="f16", metrics={"niah": 1.0},
                      samples=[{**needle_record("niah_multikey_2", 0, True), "margin": 0.134},
                               {**needle_record("niah_multikey_2", 1, True), "margin": 1.5},
                               {**needle_record("niah_multikey_2", 2, False), "margin": 0.05}])
    on = ArmResult(arm="on", model="smollm2-135m", context=7168, cache_type="f16", metrics={"niah": 0.5},
                   samples=[{**needle_record("niah_multikey_2", 0, False), "margin": 0.106},
                            {**needle_record("niah_multikey_2", 1, True), "margin": 1.4}])
    md = markdown_table(GateReport(spec=load(path), started="s", results=[dense, on]))
    assert "| needle | depth | dense's margin | dense | on |" in md
    assert "| niah_multikey_2#0 | 0.00 | 0.13 (thin) | found | LOST `7654321.` |" in md
    assert "| niah_multikey_2#1 | 0.33 | 1.50 | found | found |" in md
    assert "| niah_multikey_2#2 | 0.67 | 0.05 | `7654321.` | - |" in md  # a wrong answer is no thin needle
    assert "by less than 0.25 nats" in md
    assert "flip them in a dense run as well): niah_multikey_2#0." in md


def test_decisive_margin_is_the_smallest_gap_over_the_answer_tokens() -> None:
    from llama_sparse.gates.needles import decisive_margin

    def step(token: str, a: float, b: float) -> dict:
        return {"token": token, "top_logprobs": [{"token": token, "logprob": a}, {"token": "x", "logprob": b}]}

    resp = {"completion_probabilities": [step(" \"", -0.3, -0.31), step("19", -1.5, -1.7), step("14", -0.1, -3.0),
                                         step("164", -0.2, -4.0), step("0", -0.5, -0.6), step("\"", -2.0, -2.01)]}
    # ' "1914164' spells the 7-character value: the quote before it (0.01) and the tokens after
    # it are not part of the value
    assert decisive_margin(resp, ["1914164"]) == 0.2
    assert decisive_margin(resp, ["19141640"]) == 0.1  # a longer value takes the next token too
    assert decisive_margin({"content": "x"}, ["1"]) is None  # no probabilities sent


def test_compare_needles_is_needle_by_needle_not_a_count() -> None:
    from llama_sparse.gates.needles import compare_needles

    ref = [needle_record("niah_single_2", 0, True), needle_record("niah_single_2", 1, False),
           needle_record("niah_multikey_1", 0, True)]
    other = [needle_record("niah_single_2", 0, False), needle_record("niah_single_2", 1, True),
             needle_record("niah_multikey_1", 0, True)]
    assert compare_needles(ref, other) == (["niah_single_2#0"], ["niah_single_2#1"])  # same count, one lost
    assert compare_needles(ref, ref) == ([], [])


def test_an_arm_that_loses_a_needle_dense_found_fails_max_lost_even_with_the_same_score(tmp_path: Path) -> None:
    from llama_sparse.gates import needles
    from llama_sparse.gates.verdict import judge

    def arm(name: str, found: list[bool]) -> ArmResult:
        return ArmResult(arm=name, model="smollm2-135m", context=4096, cache_type="f16",
                         samples=[needle_record("niah_multikey_1", i, f) for i, f in enumerate(found)])

    def niah_spec(thresholds: dict):
        path = tmp_path / "n.yaml"
        path.write_text(yaml.safe_dump({"kind": "niah", "models": ["smollm2-135m"], "context_lengths": [4096],
                                        "arms": ["dense", {"name": "sparse", "flags": ["--sparse-attn", "on"]}],
                                        "thresholds": thresholds}))
        return load(path)

    dense = arm("dense", [True, False, True])
    swapped = arm("sparse", [False, True, True])      # 2 of 3 like dense, but not the same needles
    needles.count_against_reference(dense, swapped)
    assert swapped.metrics == {"lost_vs_reference": 1.0, "gained_vs_reference": 1.0}
    report = GateReport(spec=niah_spec({"max_lost": 0}), started="s", results=[dense, swapped])
    assert judge(report, needles.KIND) is False and swapped.passed is False and dense.passed is None
    same = arm("sparse", [True, False, True])
    needles.count_against_reference(dense, same)
    report.results[1] = same
    assert judge(report, needles.KIND) is True and same.passed is True
    unjudged = arm("sparse", [False, False, False])
    needles.count_against_reference(dense, unjudged)   # counted, not judged without max_lost
    report = GateReport(spec=niah_spec({}), started="s", results=[dense, unjudged])
    assert judge(report, needles.KIND) is True and unjudged.passed is None
    assert unjudged.metrics["lost_vs_reference"] == 2.0


# ---------------------------------------------------------------------------------------------
# frontier: needles kept against speed, one point per arm

@pytest.fixture
def frontier_spec(tmp_path: Path):
    path = tmp_path / "frontier.yaml"
    path.write_text(yaml.safe_dump({
        "kind": "frontier", "models": ["smollm2-135m"], "context_lengths": [4096, 7168],
        "tasks": ["niah_multikey_1"], "repeats": 5,
        "arms": ["dense", {"name": "b32-0.25", "flags": ["--sparse-attn", "on"], "coverage": 0.25},
                 {"name": "b32-0.625", "flags": ["--sparse-attn", "on"], "coverage": 0.625}]}))
    return load(path)


def needles_of(arm: str, context: int, found: list[bool]) -> ArmResult:
    return ArmResult(arm=arm, model="smollm2-135m", context=context, cache_type="f16",
                     metrics={"niah": sum(found) / len(found)},
                     samples=[needle_record("niah_multikey_1", i, f) for i, f in enumerate(found)])


def frontier_report(spec) -> GateReport:
    from llama_sparse.gates import frontier

    return GateReport(spec=spec, started="s", finished="f", kind=frontier.KIND, results=[
        needles_of("dense", 4096, [True, False, True]), needles_of("b32-0.25", 4096, [True, True, False]),
        needles_of("b32-0.625", 4096, [True, False, True]),
        needles_of("dense", 7168, [True, False]), needles_of("b32-0.25", 7168, [True, False]),
        needles_of("b32-0.625", 7168, [True, False]),
        speed("dense", 8192, 1.0, 9.2), speed("b32-0.25", 8192, 2.7, 24.8), speed("b32-0.625", 8192, 1.4, 12.8)])


def test_frontier_points_compare_needle_by_needle_and_take_the_speed_at_its_context(frontier_spec) -> None:
    from llama_sparse.gates import frontier

    report = frontier_report(frontier_spec)
    report.results.append(speed("b32-0.25", 4096, 9.9, 99.0))  # another context: not the frontier's
    pts = {p.arm: p for p in frontier.points(report)}
    assert [p for p in pts] == ["dense", "b32-0.25", "b32-0.625"]
    # same count as dense at 4K (2 of 3) but a different needle: one lost, one gained
    assert (pts["b32-0.25"].found, pts["b32-0.25"].total) == (3, 5)
    assert pts["b32-0.25"].lost == ["4K niah_multikey_1#2"] and pts["b32-0.25"].gained == ["4K niah_multikey_1#1"]
    assert pts["b32-0.625"].lost == [] and pts["b32-0.625"].ratio == 1.4
    assert pts["b32-0.25"].ratio == 2.7 and pts["b32-0.25"].bound == 4.0
    assert pts["dense"].score == 3 / 5 and all(p.complete for p in pts.values())
    md = markdown_table(report)
    assert "## Frontier: needles (niah_multikey_1, 4K, 7K) against decode speed at 8K" in md
    assert "| b32-0.25 | smollm2-135m | f16 | 3/5 | 4K niah_multikey_1#2 | 4K niah_multikey_1#1 | 24.8 | 2.70x (2.60-2.90)" in md
    assert "| b32-0.625 | smollm2-135m | f16 | 3/5 | none | - | 12.8 | 1.40x" in md
    # the needle table lists needles only, not the speed rounds
    assert "## Needle by needle: smollm2-135m, 4K, f16 (against dense)" in md


def test_frontier_errors_are_never_a_point(tmp_path: Path, frontier_spec) -> None:
    from llama_sparse.gates import frontier

    report = frontier_report(frontier_spec)
    report.results[2].fail("server died")        # b32-0.625's needles at 4K
    report.results[-2].fail("timed out")         # b32-0.25's speed
    pts = {p.arm: p for p in frontier.points(report)}
    assert not pts["b32-0.625"].complete and pts["b32-0.625"].needle_errors == 1
    assert not pts["b32-0.25"].complete and pts["b32-0.25"].speed_error
    md = markdown_table(report)
    assert "| b32-0.625 | smollm2-135m | f16 | ERROR | none | - | 12.8 | 1.40x" in md
    assert "| - | ERROR | - | - |" in md    # b32-0.25: no speed, no bound
    path = plot(report, tmp_path / "frontier.png")    # dense alone is still drawn
    assert path is not None and path.read_bytes()[:8] == PNG_MAGIC
    only_dense_speed = GateReport(spec=frontier_spec, started="s", results=[speed("dense", 8192, 1.0, 9.2)],
                                  kind=frontier.KIND)
    assert plot(only_dense_speed, tmp_path / "none.png") is None


def test_frontier_plot_is_drawn(tmp_path: Path, frontier_spec) -> None:
    path = write(frontier_report(frontier_spec), tmp_path / "run")["png"]
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_cost_curve_draws_tokens_per_second_beside_the_ratio(tmp_path: Path, spec,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib.figure

    drawn: list = []
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        drawn.append([ax.get_title() for ax in self.axes])
        return original(self, *args, **kwargs)

    results = [speed(arm, c, r, t) for c in (2048, 8192) for arm, r, t in (("dense", 1.0, 20.0), ("sparse-25", 2.0, 40.0))]
    for r in results:
        r.metrics["tfull_ms"] = 50.0
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    plot(GateReport(spec=spec, started="s", results=results), tmp_path / "curve.png")
    plot(GateReport(spec=spec, started="s", results=[r for r in results if r.context == 8192]), tmp_path / "one.png")
    assert drawn[0] == ["decode speed against context", "speed ratio"]
    assert drawn[1] == ["speed ratio"]   # one context: no curve to draw


def test_render_draws_an_earlier_run_again(tmp_path: Path, frontier_spec) -> None:
    from llama_sparse.errors import UserError
    from llama_sparse.gates.output import load as load_report
    from llama_sparse.gates.runner import render

    out = tmp_path / "run"
    report = frontier_report(frontier_spec)
    report.notes.append("prose haystack: x")
    write(report, out)
    md = (out / "report.md").read_text()
    (out / "report.md").unlink()
    (out / "plot.png").unlink()
    again = load_report(out)
    assert [r.to_dict() for r in again.results] == [r.to_dict() for r in report.results]
    assert again.spec == report.spec and again.notes == report.notes
    render(out)    # with the kind's own sections and plot
    assert (out / "report.md").read_text() == md and "## Frontier" in md and (out / "plot.png").exists()
    with pytest.raises(UserError, match="no report.json"):
        load_report(tmp_path / "nowhere")


def test_a_run_cut_short_never_reads_as_passed(tmp_path: Path, spec, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt (Ctrl-C, a killed session) in the middle of a gate: the report on disk keeps
    what was measured and says the run was cut short, with no verdict, never PASS (the answers of
    an unscored arm would otherwise sit under a PASS header)."""
    from llama_sparse.gates import runner
    from llama_sparse.gates.schema import Kind

    def run(ctx) -> None:
        ctx.record(speed("dense", 2048, 1.0, 20.0))
        ctx.save()
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "kind_of", lambda name: Kind("ab", run))
    with Progress(plain=True) as p, pytest.raises(KeyboardInterrupt):
        runner.run_gate(spec, tmp_path, out_dir=tmp_path / "run", progress=p)
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["passed"] is None and saved["cut_short"] == "KeyboardInterrupt" and saved["finished"]
    assert len(saved["results"]) == 1
    md = (tmp_path / "run" / "report.md").read_text()
    assert md.startswith("# Gate `ab-test` (ab): CUT SHORT") and "PASS" not in md.splitlines()[0]
    assert "- cut short (KeyboardInterrupt)" in md
    assert runner.render(tmp_path / "run")  # drawn again from report.json: still cut short
    assert (tmp_path / "run" / "report.md").read_text().startswith("# Gate `ab-test` (ab): CUT SHORT")
