"""Upstream's own CPU unit tests that we build and run on the patched tree.

The list is the ctest names (and the targets that make them) that need neither a network
download nor a GPU and that exercise what our patches touch or lean on: graph building for
every architecture, the KV cache and batch allocation, RoPE, quantization (our q8_0 KV
paths), threading and tokenization (our needle prompts). test-arg-parser is left out: its last part
fetches http://ggml.ai, and neither CI nor our machines reach the network.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from llama_sparse.errors import UserError

# ctest name -> target that builds it
UPSTREAM_CPU_TESTS: dict[str, str] = {
    "test-batch-alloc": "test-batch-alloc",
    "test-barrier": "test-barrier",
    "test-gguf": "test-gguf",
    "test-log": "test-log",
    "test-quantize-fns": "test-quantize-fns",
    "test-rope": "test-rope",
    "test-sampling": "test-sampling",
    "test-generate-models": "test-llama-archs",
    "test-recurrent-state-rollback": "test-recurrent-state-rollback",
    "test-tokenizer-0-llama-spm": "test-tokenizer-0",
    "test-tokenizer-0-llama-bpe": "test-tokenizer-0",
    "test-tokenizer-0-gpt-2": "test-tokenizer-0",
    "test-tokenizer-0-qwen2": "test-tokenizer-0",
    "test-tokenizer-1-llama-spm": "test-tokenizer-1-spm",
}


def targets() -> list[str]:
    return sorted(set(UPSTREAM_CPU_TESTS.values()))


def run(build_dir: Path, jobs: int = 2, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    """Run the selected upstream tests with ctest; output is returned for the caller to show."""
    if not (build_dir / "CTestTestfile.cmake").is_file():
        raise UserError(f"{build_dir} is not a configured build; run `llama-sparse build --tests`")
    pattern = "^(" + "|".join(UPSTREAM_CPU_TESTS) + ")$"
    return subprocess.run(
        ["ctest", "--test-dir", str(build_dir), "-R", pattern, "--output-on-failure",
         "-j", str(jobs), "--timeout", "900"],
        capture_output=True, text=True, timeout=timeout,
    )
