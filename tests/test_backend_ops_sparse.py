"""Upstream's test-backend-ops on our ops: the CPU kernels against the CPU reference mode."""

import re
import subprocess

import pytest

from llama_sparse.binaries import binary

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("args,min_cases", [
    (["-o", "SPARSE_ATTN_FILL"], 50),
    (["-o", "SPARSE_ATTN_SELECT"], 30),
    (["-o", "FLASH_ATTN_EXT", "-p", "block_size"], 60),
    (["-o", "SCSA_ATTN"], 47),
    # the key sketch's selection and the block tail, one graph each (the case's op is the attention)
    (["-o", "FLASH_ATTN_EXT", "-p", "tail="], 17),
])
def test_sparse_ops_match_reference(args: list[str], min_cases: int) -> None:
    proc = subprocess.run([str(binary("test-backend-ops")), "-b", "CPU", *args], capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert m, out[-3000:]
    assert int(m.group(2)) >= min_cases, "the cases must exist and run"
    assert m.group(1) == m.group(2) and proc.returncode == 0, out[-5000:]
