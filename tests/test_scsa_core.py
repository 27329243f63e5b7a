"""SCSA's arithmetic (ggml/src/ggml-cpu/scsa, patch ggml-cpu-scsa-...) on synthetic clustered KV
with known answers: plans partition the sealed rows and are deterministic, tau = 0 is dense
attention over the same f16-packed keys, the tail term equals its direct computation,
calibration freezes the right tau on a constructed error curve, a truncated cache drops the
plan. The checks live in tools/scsa/test_scsa.cpp; this runs them and reads the verdict."""

from __future__ import annotations

import re
import subprocess

import pytest

from llama_sparse.binaries import binary

pytestmark = pytest.mark.slow


def test_scsa_core_checks_pass() -> None:
    proc = subprocess.run([str(binary("llama-sparse-scsa-test"))], capture_output=True, text=True, timeout=300)
    m = re.search(r"scsa: (\d+) checks, (\d+) failed", proc.stdout)
    assert m, proc.stdout + proc.stderr
    assert int(m.group(1)) >= 90
    assert proc.returncode == 0 and m.group(2) == "0", proc.stdout


def test_scsa_selection_benchmark_reports_flat_and_hierarchical() -> None:
    """A benchmark, not a timed test: it must run and report both modes for each size."""
    proc = subprocess.run([str(binary("llama-sparse-scsa-bench")), "--rows", "32768", "--rows", "131072",
                           "--queries", "10"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in proc.stdout.splitlines() if re.match(r"^\| \d+ \|", r)]
    assert [int(r.split("|")[1]) for r in rows] == [32768, 131072]
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        flat_ms, hier_ms = float(cells[3]), float(cells[4])
        assert flat_ms > 0 and hier_ms > 0
