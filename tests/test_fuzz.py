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
    # thread counts drawn per case up to 64: the split-KV reduce lost the last threads' rows of a
    # selection at 28 and 64 threads; fills into live blocks: the fill reset a block whose first
    # cell was rewritten (before the fixes, 120 cases of seed 11: 32 fill and 2 reduce failures)
    result = fuzz.run(binary, cases=240, seed=42, threads=0)
    assert result.cases == 240, result.output[-3000:]
    assert result.ok, result.output[-3000:]
    summary = result.output.splitlines()[-1]
    assert "up to 64" in summary
    # every value, mask and fill kind was drawn
    for kind in ("uniform", "all-equal", "inf", "nan", "huge", "block-constant", "causal", "window", "single-block",
                 "empty", "holes", "fresh", "append", "reuse"):
        assert f" {kind} " in summary
    # a third of the cases run the key sketch and its block tails
    sketch = int(summary.split("key sketch ")[1].split(" ")[0])
    assert sketch >= 40, summary
    # half of those with a tolerance: it may only stop the ranking early (a subset of the blocks
    # the whole budget reads, the same log masses)
    assert int(summary.split("with a tolerance ")[1].split(")")[0]) >= 12, summary
    # several streams with one query each, every stream also run alone: a stream's selection and
    # sparse attention must be its bits alone (before the fix, several streams took the one-row
    # path and one stream the split path: 5 of 32 such cases of seed 7 differed)
    # a sixth are a prompt's rows (block-sparse prefill): scored rows and the rows that follow them
    assert int(summary.split("prompt rows ")[1].split(";")[0]) >= 25, summary
    streams = int(summary.split("streams against alone ")[1].split(";")[0])
    assert streams >= 40, summary
    # the cases built for one property each ran (a failed one fails the run above): the key sketch
    # reads the block whose stand-in would be furthest off, not the heaviest (before: the heaviest);
    # a NaN or +inf score gets dense's rule on the tiles a row that skips blocks reads (before: a
    # tile of masked keys and one NaN was dropped, the row finite where dense's is NaN (case 75 of
    # seed 42 at 64 threads); one +inf gave NaN where dense's row is that key's value)
    # a fill given row indices outside the cache (as a hostile RPC client can send, or rewrite after
    # the server's check) writes nothing for them (before: a row below zero wrote below the bounds,
    # heap-buffer-overflow; one past the end aborted)
    assert int(summary.split("designed ")[1].split(";")[0]) >= 4, summary
