"""`llama-sparse estimate`: a model's shape from its GGUF header, costs fitted from A/B reports,
the estimate for a user's model, and clear errors on what it cannot use."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparse import estimate as E
from llama_sparse.errors import UserError


def test_the_gate_models_shapes_are_their_gguf_headers(smollm2: Path, gemma3: Path) -> None:
    for key, path in (("smollm2-135m", smollm2), ("gemma3-270m", gemma3)):
        read = E.shape_from_gguf(path)
        assert dataclasses.replace(read, name="") == dataclasses.replace(E.GATE_MODELS[key], name=""), key


def test_a_sliding_window_layer_attends_its_window() -> None:
    g = E.GATE_MODELS["gemma3-270m"]  # 18 layers, every 6th global, window 512
    at = g.layers_at(16384)
    assert at.count(16384) == 3 and at.count(512) == 15
    assert E.GATE_MODELS["smollm2-135m"].layers_at(16384) == [16384] * 30


KNOWN = E.Costs(machine="m", per_weight_byte=1e-10, per_layer=5e-5,
                dense={"f16": (2e-9, 3e-10), "q8_0": (1e-9, 1.5e-10)},      # q8_0 at half of f16's
                reads={"f16": (6e-10, 9e-11), "q8_0": (3e-10, 4.5e-11)},    # a block read at 0.3 of dense's
                select=(3e-10, 4e-11), rechecked_fraction=0.05, scsa_share={"f16": 0.15}, source="",
                scsa_rechecked_fraction=0.04)


def _report(tmp_path: Path, model: str, costs: E.Costs, name: str) -> Path:
    """An ab report whose every point is what `costs` says, as a gate would write it."""
    shape = E.GATE_MODELS[model]
    arms = [{"name": "dense", "flags": []},
            {"name": "everywhere", "flags": ["--sparse-attn", "on", "--sparse-attn-min-kv", "0"]},
            {"name": "scsa", "flags": ["--sparse-attn", "scsa"]},
            {"name": "scsa-no-audit", "flags": ["--sparse-attn", "scsa", "--scsa-audit-steps", "0"]},
            {"name": "bounds", "flags": ["--sparse-attn", "on", "--sparse-attn-score", "bound"]}]
    t0 = E.weights_time(costs, shape) * 1e3
    results = []
    for n, fraction in ((1024, 0.3), (2048, 0.25), (4096, 0.2), (8192, 0.12), (16384, 0.1)):
        for cache in ("f16", "q8_0"):
            e = E.estimate(costs, shape, n, cache, fraction, min_kv=0)
            for arm, ms, extra in (("dense", e.dense_ms, {"t0_ms": t0}),
                                   ("everywhere", e.block_ms, {"read_fraction": fraction, "rechecked_fraction": 0.05}),
                                   ("scsa", e.scsa_ms, {"rechecked_fraction": costs.scsa_rechecked_fraction}),
                                   ("scsa-no-audit", 1.0, {}), ("bounds", 1.0, {"read_fraction": 0.6})):
                if ms is None or (arm.startswith("scsa") and n < 4096):
                    continue
                results.append({"arm": arm, "model": model, "context": n, "cache_type": cache, "batch": 1,
                                "metrics": {"decode_tps_median": 1000.0 / ms, **extra}, "error": None})
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"kind": "ab", "spec": {"arms": arms}, "results": results,
                                "machine": {"cpu": "a CPU", "cores_usable": 2}}))
    return path


def test_the_fit_finds_the_costs_that_made_the_points(tmp_path: Path) -> None:
    reports = [E.read_report(_report(tmp_path, m, KNOWN, m)) for m in E.GATE_MODELS]
    # the bounds' arm is not the block method's defaults, nor SCSA without audits SCSA's: they are
    # left out, not fitted
    assert {p.method for r in reports for p in r.points} == {"dense", "block", "scsa"}
    assert not [p for r in reports for p in r.points if p.arm == "scsa-no-audit"]
    fitted = E.calibrate(reports)
    assert fitted.per_weight_byte == pytest.approx(KNOWN.per_weight_byte, rel=1e-6)
    assert fitted.per_layer == pytest.approx(KNOWN.per_layer, rel=1e-6)
    for cache in ("f16", "q8_0"):
        assert fitted.dense[cache] == pytest.approx(KNOWN.dense[cache], rel=1e-6)
        assert fitted.reads[cache] == pytest.approx(KNOWN.reads[cache], rel=1e-6)
    assert fitted.select == pytest.approx(KNOWN.select, rel=1e-6)
    assert fitted.scsa_share["f16"] == pytest.approx(0.15, rel=1e-6)
    # SCSA's steps computed again cost a dense step each, apart from its share of the attention
    assert fitted.scsa_rechecked_fraction == pytest.approx(0.04)
    _, worst = E.error_table(fitted, E.GATE_MODELS["gemma3-270m"], reports[1].points)
    assert worst < 1e-6


def test_one_head_size_cannot_tell_a_keys_fixed_work_from_its_values(tmp_path: Path) -> None:
    """From one model the fit still reproduces that model's points, whichever split it takes."""
    report = E.read_report(_report(tmp_path, "smollm2-135m", KNOWN, "one"))
    fitted = E.calibrate([report])
    _, worst = E.error_table(fitted, E.GATE_MODELS["smollm2-135m"], report.points)
    assert worst < 1e-3


def test_the_estimate_follows_the_context_and_the_minimum() -> None:
    llama = E.PRESETS["Llama-3.1-8B"]
    short = E.estimate(KNOWN, llama, 2048)
    assert short.block_ms == short.dense_ms  # below the minimum both methods decode densely
    speedups = [E.estimate(KNOWN, llama, n).block_speedup for n in (8192, 32768, 131072)]
    assert 1.0 < speedups[0] < speedups[1] < speedups[2]
    # reading fewer blocks is faster; the selection is paid whatever the fraction
    assert E.estimate(KNOWN, llama, 32768, read_fraction=0.1).block_ms < E.estimate(KNOWN, llama, 32768).block_ms


def test_what_it_cannot_use_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        E.shape_from_gguf(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(UserError, match="not a GGUF file"):
        E.shape_from_gguf(junk)
    niah = tmp_path / "niah.json"
    niah.write_text(json.dumps({"kind": "niah", "spec": {"arms": []}, "results": []}))
    with pytest.raises(UserError, match="ab report"):
        E.read_report(niah)
    with pytest.raises(UserError, match="q4_0"):
        E.estimate(KNOWN, E.PRESETS["Qwen2.5-7B"], 8192, "q4_0")
    with pytest.raises(UserError, match="read fraction"):
        E.estimate(KNOWN, E.PRESETS["Qwen2.5-7B"], 8192, read_fraction=0.0)
    for bad in ("0", "-4k", "lots"):
        with pytest.raises(UserError):
            E.parse_context(bad)
    assert E.parse_context("32k") == 32768 and E.parse_context("5000") == 5000


def test_the_command_prints_the_table_and_its_check(project) -> None:
    run = lambda *a: subprocess.run([sys.executable, "-m", "llama_sparse", "estimate", *a],  # noqa: E731
                                    capture_output=True, text=True, cwd=project.root, timeout=120)
    out = run()
    assert out.returncode == 0, out.stderr
    for name in ("Llama-3.1-8B", "Qwen2.5-7B", "Gemma-3-12B"):
        assert sum(name in line for line in out.stdout.splitlines()) == 6, out.stdout  # 3 lengths x 2 caches
    check = run("--check")
    assert check.returncode == 0, check.stderr
    assert "largest error" in check.stdout
    bad = run("--context", "huge")
    assert bad.returncode != 0 and "--context" in bad.stderr
    one = run("--model", "Qwen2.5-7B", "--context", "64k", "--cache-type-k", "f16")
    assert one.returncode == 0, one.stderr
    assert [line.split("|")[1:4] for line in one.stdout.splitlines() if "Qwen2.5-7B" in line] == [
        [" Qwen2.5-7B Q4_K_M ", " 64K ", " f16 "]]


def test_the_docs_table_is_what_the_command_prints(project) -> None:
    """docs/estimate.md shows the table `llama-sparse estimate` prints from the current reports:
    a report published again (new costs) without the page written again fails here."""
    out = subprocess.run([sys.executable, "-m", "llama_sparse", "estimate"], capture_output=True, text=True,
                         cwd=project.root, timeout=120)
    assert out.returncode == 0, out.stderr
    table = [line for line in out.stdout.splitlines() if line.startswith("|")]
    page = (project.root / "docs" / "estimate.md").read_text()
    assert len(table) == 2 + 18 and all(line in page.splitlines() for line in table), (
        "docs/estimate.md's table differs from `llama-sparse estimate`: paste its table again")
