"""With --sparse-attn off nothing is allocated; with it on, only the side cache beside the K cache (on the CPU by
default the key bounds, the block statistics and the key sketch)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from llama_sparse.binaries import binary

pytestmark = pytest.mark.slow


def run_logits_tool(model: Path, tmp_path: Path, *flags: str) -> str:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The grass is green. The sky is blue. " * 40)
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(model), "-f", str(prompt), "-c", "1024",
                           "-fa", "on", "--dump-steps", "4", "--dump-out", str(tmp_path / "out.bin"), "--dump-prompt-tokens", "900",
                           "-lv", "4", *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("model_fixture", ["tiny_qwen3", "smollm2"])
def test_off_allocates_nothing_on_allocates_bounds(request, tmp_path: Path, model_fixture: str) -> None:
    model = request.getfixturevalue(model_fixture)
    off = run_logits_tool(model, tmp_path, "--sparse-attn", "off")
    on = run_logits_tool(model, tmp_path, "--sparse-attn", "on", "--sparse-attn-min-kv", "0")
    kv_lines = lambda text: re.findall(r"KV buffer size = .*", text)  # noqa: E731
    assert kv_lines(off) and kv_lines(off) == kv_lines(on)        # the K/V cache itself is the same
    assert "sparse-attention key bounds" not in off              # off: no side cache at all
    assert "sparse_attn           =" not in off and "sparse_attn           = on" in on
    # the default block, and the default score on the CPU: the key sketch beside the bounds
    assert re.search(r"sparse-attention key bounds, block statistics and key sketch = +[0-9.]+ MiB \(block 32, \d+ blocks\)", on)
