"""Block-sparse prefill with several slots: two prompts evaluated together, each slot in a KV stream
of its own (`--parallel 2`), as llama-server serves them. Each slot's prompt is read sparsely and
says so in its own `timings`; a selection of every block gives dense's tokens in both slots."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from llama_sparse.gates.texts import reference_text
from llama_sparse.server import ServerConfig, ServerProcess

pytestmark = pytest.mark.slow

N_PREDICT = 16
FROM_THE_FIRST_ROW = ["--sparse-prefill", "on", "--sparse-attn-min-kv", "0"]
SELECT_ALL = [*FROM_THE_FIRST_ROW, "--sparse-prefill-coverage", "1", "--sparse-prefill-tolerance", "0"]


def _prompts() -> list[str]:
    text = reference_text()
    return [text[:1800], text[30000:31800]]   # about 1,700 tokens each on the tiny model


def _together(server: ServerProcess) -> list[dict]:
    """Both prompts at once, one per slot, so the server evaluates them in the same batches."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(server.complete, p, N_PREDICT, ignore_eos=True, id_slot=i, return_tokens=True)
                   for i, p in enumerate(_prompts())]
        return [f.result() for f in futures]


def _config(model: Path, extra: list[str]) -> ServerConfig:
    return ServerConfig(model, ctx_size=2 * 4096, parallel=2, threads=2, cache_prompt=False, extra_args=extra)


def test_two_slots_prefill_sparsely_and_select_all_is_dense(start_server, tiny_qwen3: Path) -> None:
    dense = _together(start_server(_config(tiny_qwen3, []), "dense"))
    select_all = _together(start_server(_config(tiny_qwen3, SELECT_ALL), "select-all"))
    sparse = _together(start_server(_config(tiny_qwen3, FROM_THE_FIRST_ROW), "sparse"))

    for slot, (d, a, s) in enumerate(zip(dense, select_all, sparse)):
        assert d["timings"]["prompt_n"] == a["timings"]["prompt_n"] == s["timings"]["prompt_n"] > 1000
        assert "sparse" not in d["timings"]          # a dense server adds no figures
        # every block each row sees, read through the prompt selection: dense's tokens
        sp = a["timings"]["sparse"]
        assert sp["prefill_blocks_read"] == sp["prefill_blocks_visible"] > 0, sp
        assert a["tokens"] == d["tokens"], f"slot {slot}: a select-all prefill decoded other tokens than dense"
        # the default coverage: the slot's own prompt read a part of what it sees, counted for it
        sp = s["timings"]["sparse"]
        assert 0 < sp["prefill_blocks_read"] < sp["prefill_blocks_visible"], sp
        assert sp["prefill_read_fraction"] == pytest.approx(sp["prefill_blocks_read"] / sp["prefill_blocks_visible"])
        assert sp["prefill_read_fraction"] < 0.5, sp
    # the two slots' prompts differ, so do their counts: each response carries its own
    assert sparse[0]["timings"]["sparse"] != sparse[1]["timings"]["sparse"]
