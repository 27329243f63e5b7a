"""The block-sparse CPU kernels fuzzed under AddressSanitizer and UBSan (tools/fuzz)."""

from __future__ import annotations

import pytest

from llama_sparse import fuzz


def test_summary_and_sanitizer_reports_are_read() -> None:
    ok = fuzz.FuzzResult(0, "fuzz: 10 cases, 0 failed (seed 1, 4 threads); keys: ...\n", 10, 0)
    assert ok.ok and not ok.sanitizer_report
    asan = fuzz.FuzzResult(1, "==1==ERROR: AddressSanitizer: heap-buffer-overflow\n", None, None)
    assert asan.sanitizer_report and not asan.ok
    ubsan = fuzz.FuzzResult(0, "ops.cpp:12: runtime error: signed integer overflow\nfuzz: 3 cases, 0 failed\n", 3, 0)
    assert ubsan.sanitizer_report and not ubsan.ok
    failed = fuzz.FuzzResult(1, "FAIL case 2: ...\nfuzz: 3 cases, 1 failed\n", 3, 1)
    assert not failed.ok


@pytest.mark.slow
def test_fuzz_under_sanitizers(project) -> None:
    binary = fuzz.build(project, log=lambda _: None)
    result = fuzz.run(binary, cases=300, seed=42, threads=4)
    assert result.cases == 300, result.output[-3000:]
    assert result.ok, result.output[-3000:]
    # every value and mask kind was drawn
    for kind in ("uniform", "all-equal", "inf", "nan", "huge", "causal", "window", "single-block", "empty", "holes"):
        assert f" {kind} " in result.output.splitlines()[-1]
