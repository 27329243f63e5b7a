"""The KV cache life cycle with block-sparse attention on: the key bounds never go stale.

`llama-sparse-cachecheck` (tools/cachecheck) runs prompt-cache reuse, sequence removal,
context shift, slot save and restore and seq_keep the way llama-server does, teacher-forced on
a fixed text, and after each operation asks llama_sparse_attn_check_bounds how many blocks have
bounds holding a key no cell holds (loose: stale) or missing a key a cell holds (short). With the
removal fix taken out, `loose` is 1170 after the suffix removal and 720 after seq_keep on
SmolLM2; with the restore rebuilt before the reader flushed, 720 blocks are loose and short
after a restore (both measured while writing the fix): these tests fail on either.

Select-all sparse against dense is bit-identical across every operation: the logits of every
decode step hash the same.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from llama_sparse.binaries import binary
from llama_sparse.gates.texts import reference_text

pytestmark = pytest.mark.slow

SCENARIOS = {"prompt-reuse", "seq-removal", "context-shift", "save-restore", "seq-keep", "first-cell-reuse"}


def cachecheck(model: Path, tmp_path: Path, *flags: str, prompt_tokens: int = 1000) -> dict:
    out = cachecheck_run(model, tmp_path, *flags, prompt_tokens=prompt_tokens)
    return {s["name"]: s for s in out["scenarios"]}


def cachecheck_run(model: Path, tmp_path: Path, *flags: str, prompt_tokens: int = 1000) -> dict:
    text = tmp_path / "text.txt"
    if not text.exists():
        text.write_text(reference_text()[:40000])
    proc = subprocess.run([str(binary("llama-sparse-cachecheck")), "-m", str(model), "-f", str(text), "-c", "4096",
                           "-fa", "on", "-t", "2", "--cc-prompt-tokens", str(prompt_tokens), *flags],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert {s["name"] for s in out["scenarios"]} == SCENARIOS
    return out


def assert_bounds_exact(run: dict) -> None:
    for name, s in run.items():
        assert s["checks"], f"{name}: no bounds check ran (is sparse attention on?)"
        for c in s["checks"]:
            assert c["blocks"] > 0
            assert c["loose"] == 0, f"{name}: after {c['after']}: {c['loose']} blocks hold stale keys"
            assert c["short"] == 0, f"{name}: after {c['after']}: {c['short']} blocks miss keys they hold"


@pytest.mark.parametrize("model_fixture", ["smollm2", "tiny_qwen3"])
def test_select_all_equals_dense_through_every_cache_operation(request, tmp_path: Path, model_fixture: str) -> None:
    model = request.getfixturevalue(model_fixture)
    dense = cachecheck(model, tmp_path, "--sparse-attn", "off")
    select_all = cachecheck(model, tmp_path, "--sparse-attn", "on", "--sparse-attn-topk", "100000")
    for name in SCENARIOS:
        assert len(dense[name]["steps"]) > 0
        assert dense[name]["steps"] == select_all[name]["steps"], f"{name}: select-all logits differ from dense"
        assert not dense[name]["checks"]   # off: no bounds to check
    assert_bounds_exact(select_all)


# (layers, KV heads, head size) of the fixtures' models
MODEL_SHAPES = {"smollm2": (30, 3, 64), "tiny_qwen3": (2, 2, 64)}


@pytest.mark.parametrize("model_fixture", ["smollm2", "tiny_qwen3"])
def test_memory_breakdown_counts_the_key_bounds(request, tmp_path: Path, model_fixture: str) -> None:
    """The key bounds are context memory: llama's memory breakdown (what --fit sizes the context
    with, and what it prints) must hold them, to the byte."""
    model = request.getfixturevalue(model_fixture)
    dense = cachecheck_run(model, tmp_path, "--sparse-attn", "off", prompt_tokens=256)
    sparse = cachecheck_run(model, tmp_path, "--sparse-attn", "on", "--sparse-attn-block-size", "64", prompt_tokens=256)
    n_layer, n_head_kv, head = MODEL_SHAPES[model_fixture]
    n_blocks = -(-sparse["n_ctx"] // 64)
    bounds = n_layer * n_head_kv * n_blocks * 2 * head * 4   # f32 minimum and maximum per channel
    assert dense["n_ctx"] == sparse["n_ctx"]
    assert sparse["context_bytes"] - dense["context_bytes"] == bounds


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_bounds_stay_exact_with_top_k_selection(smollm2: Path, tmp_path: Path, cache_type: str) -> None:
    run = cachecheck(smollm2, tmp_path, "--sparse-attn", "on", "--sparse-attn-coverage", "0.25",
                     "-ctk", cache_type, "-ctv", cache_type)
    assert_bounds_exact(run)
    # the checks covered the operations that could leave bounds stale
    after = {c["after"] for s in run.values() for c in s["checks"]}
    assert {"seq_rm of the suffix", "seq_rm of sequence 1", "restore", "seq_keep of sequence 0",
            "context shift and decode", "a new sequence in its cells"} <= after


def test_gemma3_global_layers_keep_exact_bounds(gemma3: Path, tmp_path: Path) -> None:
    # iSWA: only the full-attention layers keep bounds; removal goes through both caches
    dense = cachecheck(gemma3, tmp_path, "--sparse-attn", "off", prompt_tokens=600)
    select_all = cachecheck(gemma3, tmp_path, "--sparse-attn", "on", "--sparse-attn-topk", "100000", prompt_tokens=600)
    for name in SCENARIOS:
        assert dense[name]["steps"] == select_all[name]["steps"], f"{name}: select-all logits differ from dense"
    assert_bounds_exact(select_all)
