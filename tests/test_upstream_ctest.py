"""Upstream's own CPU unit tests, built from the patched tree, must pass."""

import re

import pytest

from llama_sparse import ctest

pytestmark = pytest.mark.slow


def test_upstream_cpu_unit_tests_pass(project) -> None:
    proc = ctest.run(project.build_dir / "patched")
    summary = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", proc.stdout)
    assert summary, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert int(summary.group(3)) == len(ctest.UPSTREAM_CPU_TESTS), "every selected test must be built and run"
    assert proc.returncode == 0 and summary.group(2) == "0", proc.stdout[-5000:]
