"""Every --sparse-attn* flag refuses a bad value at start-up, naming the flag and its range."""

from __future__ import annotations

import subprocess

import pytest

from llama_sparse.binaries import binary

pytestmark = pytest.mark.slow

BAD_VALUES = [
    (["--sparse-attn", "maybe"], "--sparse-attn takes off, on or auto"),
    (["--sparse-attn-block-size", "48"], "--sparse-attn-block-size must be a multiple of 32 in [32, 4096], got 48"),
    (["--sparse-attn-block-size", "8192"], "--sparse-attn-block-size must be a multiple of 32 in [32, 4096], got 8192"),
    (["--sparse-attn-topk", "0"], "--sparse-attn-topk must be in [1, 1048576], got 0"),
    (["--sparse-attn-coverage", "0"], "--sparse-attn-coverage must be a number in (0, 1], got '0'"),
    (["--sparse-attn-coverage", "1.5"], "--sparse-attn-coverage must be a number in (0, 1], got '1.5'"),
    (["--sparse-attn-coverage", "half"], "--sparse-attn-coverage must be a number in (0, 1], got 'half'"),
    (["--sparse-attn-recent", "-1"], "--sparse-attn-recent must be in [0, 1048576], got -1"),
    (["--sparse-attn-sink", "-4"], "--sparse-attn-sink must be in [0, 1048576], got -4"),
    (["--sparse-attn-min-kv", "-1"], "--sparse-attn-min-kv must be in [0, 16777216], got -1"),
    (["--sparse-attn", "on", "-fa", "off"], "--sparse-attn needs flash attention, but --flash-attn is off"),
]


@pytest.mark.parametrize("tool", ["llama-server", "llama-cli"])
@pytest.mark.parametrize("args,message", BAD_VALUES, ids=[" ".join(a) for a, _ in BAD_VALUES])
def test_bad_value_refused_at_startup(tool: str, args: list[str], message: str, tiny_qwen3) -> None:
    proc = subprocess.run([str(binary(tool)), "-m", str(tiny_qwen3), *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout


@pytest.mark.parametrize("env,message", [
    ({"LLAMA_ARG_SPARSE_ATTN_COVERAGE": "2"}, "--sparse-attn-coverage must be a number in (0, 1]"),
    ({"LLAMA_ARG_SPARSE_ATTN_BLOCK_SIZE": "33"}, "--sparse-attn-block-size must be a multiple of 32"),
])
def test_bad_environment_value_refused(env: dict[str, str], message: str, tiny_qwen3) -> None:
    import os

    proc = subprocess.run([str(binary("llama-server")), "-m", str(tiny_qwen3)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout


BENCH_BAD_VALUES = [
    (["--sparse-attn", "maybe"], "--sparse-attn must be off, on or auto, got 'maybe'"),
    (["--sparse-attn-block-size", "40"], "--sparse-attn-block-size must be a multiple of 32 in [32, 4096], got '40'"),
    (["--sparse-attn-coverage", "0"], "--sparse-attn-coverage must be a number in (0, 1], got '0'"),
    (["--sparse-attn-topk", "0"], "--sparse-attn-topk must be in [1, 1048576], got '0'"),
    (["--sparse-attn-recent", "x"], "--sparse-attn-recent must be in [0, 1048576], got 'x'"),
    (["--sparse-attn", "on", "-fa", "off"], "--sparse-attn needs flash attention, but --flash-attn is off"),
]


@pytest.mark.parametrize("args,message", BENCH_BAD_VALUES, ids=[" ".join(a) for a, _ in BENCH_BAD_VALUES])
def test_llama_bench_refuses_bad_value(args: list[str], message: str, tiny_qwen3) -> None:
    proc = subprocess.run([str(binary("llama-bench")), "-m", str(tiny_qwen3), *args], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout


def test_llama_bench_runs_sparse(tiny_qwen3) -> None:
    proc = subprocess.run([str(binary("llama-bench")), "-m", str(tiny_qwen3), "-p", "0", "-n", "16", "-d", "1024",
                           "-r", "1", "-t", "2", "--sparse-attn", "on", "--sparse-attn-coverage", "0.25"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "block-sparse attention on (block 64, coverage 0.25" in proc.stderr
    assert "tg16" in proc.stdout


def test_help_lists_every_flag() -> None:
    out = subprocess.run([str(binary("llama-server")), "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    for flag in ("--sparse-attn ", "--sparse-attn-block-size", "--sparse-attn-topk", "--sparse-attn-coverage",
                 "--sparse-attn-recent", "--sparse-attn-sink", "--sparse-attn-min-kv"):
        assert flag in text, flag
