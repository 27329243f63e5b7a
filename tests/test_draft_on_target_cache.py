"""A draft context on its target's KV cache under --sparse-attn: llama-server starts, the draft
decodes dense and says so, the target keeps its sparse setting.

Gemma 4's assistant (`gemma4-assistant`) keeps no KV cache of its own: common/speculative.cpp
creates its context with `ctx_other` = the target's context, and its layers read the target's
cache. The sparse setting applies to every context of a process, and the block method keeps key
bounds beside a cache its context writes, which a draft on another's cache does not: before the
fix `--sparse-attn on -md <assistant>` threw at the draft's creation and llama-server did not
start. Now the draft's context decodes dense with a warning. The pair is tiny-gemma4 (random
weights, our own writer); upstream does not infer the draft's type from an assistant GGUF (it
looks for MTP heads, `blk.N.nextn.eh_proj`), so the tests name it: `--spec-type draft-mtp`.
"""

from __future__ import annotations

import re

import pytest

from llama_sparse.gates.texts import reference_text
from llama_sparse.server import ServerConfig, ServerProcess
from llama_sparse.tinygemma4 import TinyGemma4Pair, TinyGemma4Shape, write_cached

pytestmark = pytest.mark.slow

N_PREDICT = 8
DRAFT_WARNING = "this context reads the KV cache of another context"
KEY_BOUNDS = "sparse-attention key bounds"   # logged by each context that keeps them for its cache
DRAFT_LOADING = "loading draft model"
LOADED = "model loaded"   # the server's line after both contexts are made
UPSTREAM_VERBOSITY = 3    # llama-server's default -lv: warnings and the server's own lines
# speculative.cpp's statistics at the end of a request (-lv 4): calls to draft, drafts kept
_DRAFT_STATISTICS = re.compile(r"statistics\s+draft-mtp: #calls\(b,g,a\) =\s+\d+\s+(\d+)\s+\d+, #gen drafts =\s+(\d+)")
# the graphs a context reserves at its creation, each input and the operation reading it (-lv 5)
_KQ_MASK_READER = re.compile(r"input tensor '\s*attn_inp_kq_mask' \[[^]]*\] is used by node '[^']*' \((\w+)\)")


@pytest.fixture(scope="module")
def tiny_gemma4() -> TinyGemma4Pair:
    return write_cached(TinyGemma4Shape())


def _prompt() -> str:
    return reference_text()[:600]   # a few hundred tokens of the byte-level vocabulary: a dozen blocks of 32


def _start(start_server, pair: TinyGemma4Pair, mode: str, draft_p_min: str, verbosity: int) -> ServerProcess:
    return start_server(ServerConfig(
        pair.target, ctx_size=1024, parallel=1, threads=2, cache_prompt=False,
        extra_args=["-md", str(pair.assistant), "--spec-type", "draft-mtp", "--spec-draft-p-min", draft_p_min,
                    "--sparse-attn", mode, "--sparse-attn-min-kv", "0", "-lv", str(verbosity)]))


def _draft_statistics(log: str) -> tuple[int, int] | None:
    """(calls to draft, drafts kept) from the statistics line, None before it is logged."""
    m = _DRAFT_STATISTICS.search(log)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _startup_log(server: ServerProcess) -> tuple[str, str]:
    """The start-up log before the draft model loads (the target's contexts) and from it on, once
    the server has logged the end of loading (its log is written by a thread of its own)."""
    log = server.wait_log(LOADED)
    at = log.index(DRAFT_LOADING)
    return log[:at], log[at:]


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_server_starts_with_a_draft_on_the_target_cache(start_server, tiny_gemma4: TinyGemma4Pair, mode: str) -> None:
    # a minimum probability of 0 keeps every token the assistant proposes: it drafts each step
    server = _start(start_server, tiny_gemma4, mode, draft_p_min="0", verbosity=UPSTREAM_VERBOSITY)
    _, draft_log = _startup_log(server)
    # the assistant's layers are views of the target's cache: its last sliding-window layer and
    # its last full-attention layer
    assert draft_log.count("sharing with layer") == 2, server.log_tail()
    assert f"sparse_attn = {mode}: {DRAFT_WARNING} (a draft model on its target's cache); it decodes dense, " \
           "the cache's owner keeps its sparse setting" in draft_log
    assert draft_log.count(DRAFT_WARNING) == 1

    resp = server.complete(_prompt(), n_predict=N_PREDICT, ignore_eos=True)
    assert resp["tokens_predicted"] == N_PREDICT
    timings = resp["timings"]
    assert timings["draft_n"] > 0, timings            # the draft context decoded, on the target's cache
    assert timings["sparse"]["method"] == "block", timings  # the target kept its sparse setting


def test_the_draft_decodes_dense_while_the_target_decodes_sparse(start_server, tiny_gemma4: TinyGemma4Pair) -> None:
    """The target reads sparsely at every decode step while its draft decodes beside it, dense.
    A draft the target verifies makes the step a batch of several tokens, which the block method
    reads densely: a minimum probability above 1 makes the draft decode each step and keep
    nothing, so each of the target's steps is one token."""
    # -lv 5: each reserved graph's inputs and the operations reading them
    server = _start(start_server, tiny_gemma4, "on", draft_p_min="1.1", verbosity=5)
    target_log, draft_log = _startup_log(server)
    # the target keeps key bounds beside its cache and its decode graph selects blocks; the
    # draft keeps none and its decode graph hands the mask to flash attention, dense
    assert KEY_BOUNDS in target_log and "SPARSE_ATTN_SELECT" in _KQ_MASK_READER.findall(target_log), server.log_tail()
    assert KEY_BOUNDS not in draft_log and DRAFT_WARNING in draft_log, server.log_tail()
    assert set(_KQ_MASK_READER.findall(draft_log)) == {"FLASH_ATTN_EXT"}, server.log_tail()

    offset = server.log_size()
    resp = server.complete(_prompt(), n_predict=N_PREDICT, ignore_eos=True)
    assert resp["tokens_predicted"] == N_PREDICT
    sparse = resp["timings"]["sparse"]
    # every decode step after the prompt's is sparse (the first token comes from the prompt)
    assert sparse["method"] == "block" and sparse["steps_sparse"] == N_PREDICT - 1, sparse
    assert 0 < sparse["blocks_read"] < sparse["blocks_visible"], sparse
    # the draft decoded beside it (dense, by the graph above) and its tokens were all dropped
    draft_calls, drafts_kept = server.wait_log_until(_draft_statistics, offset=offset, what="the draft's statistics")
    assert draft_calls > 0 and drafts_kept == 0, (draft_calls, drafts_kept)
