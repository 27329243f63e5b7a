"""A prompt that reaches the server while another slot decodes is attended as it is alone.

With a KV stream per slot llama splits a batch into micro-batches of equal tokens per sequence,
so one slot's decode token and the first token of another slot's prompt used to make one
micro-batch of one token each, which the sparse path took for a decode step: that prompt row was
read sparsely under load where alone it is part of a dense prefill. The response's count of
visible block reads (decode rows only, in its `timings`) shows it: under load the prompt's request counted
one row more than alone. Now a prompt and a decode step never share a micro-batch, and a row of a
sequence with several tokens in its batch is never sparse. The count of visible blocks does not
depend on arithmetic, only on which rows are read sparsely, so it must be equal exactly."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import requests

from llama_sparse import timings
from llama_sparse.gates.texts import reference_text
from llama_sparse.server import ServerConfig, ServerProcess

pytestmark = pytest.mark.slow

N_PREDICT = 8


class DecodingRequest:
    """A long streamed generation on another slot; `decoding` is set once tokens arrive, and
    `tokens_after_mark` counts the tokens that arrived after mark() (proof of the overlap)."""

    def __init__(self, server: ServerProcess, prompt: str):
        self.body = {"prompt": prompt, "n_predict": 1024, "ignore_eos": True, "temperature": 0.0,
                     "top_k": 1, "stream": True, "id_slot": 0, "cache_prompt": False}
        self.url = f"{server.url}/completion"
        self.decoding = threading.Event()
        self.stop = threading.Event()
        self.marked = False
        self.tokens = 0
        self.tokens_after_mark = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            with requests.post(self.url, json=self.body, stream=True, timeout=600) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if self.stop.is_set():
                        break  # closing the connection ends the generation
                    if not line.startswith(b"data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("content") is not None:
                        self.tokens += 1
                        self.tokens_after_mark += self.marked
                        if self.tokens >= 4:
                            self.decoding.set()
                    if chunk.get("stop"):
                        break
        except BaseException as e:  # reported by the test thread
            self.error = e
        finally:
            self.decoding.set()

    def mark(self) -> None:
        self.marked = True


def alone_and_beside_a_decoding_slot(server: ServerProcess, prompt: str | list[int], other_prompt: str, **params):
    """The same request (slot 1) alone, then while slot 0 streams a long answer: both responses,
    both timing records, and how many of slot 0's tokens arrived during the second request."""
    alone = server.complete(prompt, n_predict=N_PREDICT, ignore_eos=True, id_slot=1, cache_prompt=False, **params)
    alone_rec = timings.from_response(alone)

    other = DecodingRequest(server, other_prompt)
    other.thread.start()
    assert other.decoding.wait(timeout=300) and other.error is None, other.error
    other.mark()
    loaded = server.complete(prompt, n_predict=N_PREDICT, ignore_eos=True, id_slot=1, cache_prompt=False, **params)
    overlap = other.tokens_after_mark
    other.stop.set()
    other.thread.join(timeout=120)
    loaded_rec = timings.from_response(loaded)
    assert other.error is None, other.error
    assert overlap > 0, "the other slot did not decode while the prompt was served: no overlap to test"
    assert alone["tokens_predicted"] == loaded["tokens_predicted"] == N_PREDICT
    return alone, alone_rec, loaded, loaded_rec, overlap


def test_prompt_beside_a_decoding_slot_counts_the_visible_blocks_it_counts_alone(start_server, smollm2: Path) -> None:
    server = start_server(ServerConfig(model=smollm2, ctx_size=8192, parallel=2, cache_prompt=False,
                                       extra_args=["--no-kv-unified", "--sparse-attn", "on", "--sparse-attn-min-kv", "0"]))
    text = reference_text()
    # about 1400 tokens: one batch, three micro-batches of prefill
    _, alone_rec, _, loaded_rec, overlap = alone_and_beside_a_decoding_slot(server, text[:6000], text[30000:31000])
    assert loaded_rec.sparse_blocks_visible == alone_rec.sparse_blocks_visible, (
        f"visible block reads of the request's decode rows: {loaded_rec.sparse_blocks_visible} beside a decoding "
        f"slot ({overlap} of its tokens during the request), {alone_rec.sparse_blocks_visible} alone: rows of the "
        "prompt were attended as decode rows")
    # the server stays healthy after the cancelled stream
    assert server.request("GET", "/health")["status"] == "ok"


def test_no_lone_prompt_token_in_a_batch(start_server, smollm2: Path) -> None:
    """A prompt of 20 batches and one token (batch 64): alone its last token used to be a batch of
    its own, one token of its sequence, which llama reads as a decode step (sparse); beside a
    decoding slot the batches hold 63 prompt tokens and the last holds 21 (dense). The server now
    never leaves a prompt's lone token for a batch of its own, so both count the same rows."""
    server = start_server(ServerConfig(model=smollm2, ctx_size=8192, parallel=2, cache_prompt=False,
                                       batch_size=64, ubatch_size=64,
                                       extra_args=["--no-kv-unified", "--sparse-attn", "on", "--sparse-attn-min-kv", "0"]))
    text = reference_text()
    tokens = server.tokenize(text[:8000])[:64*20 + 1]
    assert len(tokens) == 64*20 + 1
    alone, alone_rec, loaded, loaded_rec, overlap = alone_and_beside_a_decoding_slot(server, tokens, text[30000:31000])
    assert alone["timings"]["prompt_n"] == loaded["timings"]["prompt_n"] == len(tokens)
    assert loaded_rec.sparse_blocks_visible == alone_rec.sparse_blocks_visible, (
        f"visible block reads of the request's decode rows: {alone_rec.sparse_blocks_visible} alone, "
        f"{loaded_rec.sparse_blocks_visible} beside a decoding slot ({overlap} of its tokens during the request): "
        "a prompt token alone in a batch was read as a decode step")


def test_prompt_beside_a_decoding_slot_in_a_unified_cache(start_server, smollm2: Path) -> None:
    """The unified cache splits simply (tokens in batch order): the decode token goes in a
    micro-batch of its own there too, the prompt's tokens in theirs, and both requests complete.
    (In a unified cache the requests' cells interleave, so the visible-block count need not be
    the same as alone; this run checks that the split serves both.)"""
    server = start_server(ServerConfig(model=smollm2, ctx_size=8192, parallel=2, cache_prompt=False,
                                       extra_args=["--kv-unified", "--sparse-attn", "on", "--sparse-attn-min-kv", "0"]))
    text = reference_text()
    alone, _, loaded, _, _ = alone_and_beside_a_decoding_slot(server, text[:6000], text[30000:31000])
    assert loaded["timings"]["prompt_n"] == alone["timings"]["prompt_n"]
    assert server.request("GET", "/health")["status"] == "ok"


def test_a_prompt_cut_under_load_where_it_is_cut_alone_gets_alones_logits(start_server, smollm2: Path) -> None:
    """At -b 560 -ub 512 a prompt evaluated alone goes in batches of 560 tokens, micro-batches of
    512 and 48; the 48 rows are under the CPU flash attention's 64-row tile, so they take its
    one-row path. Beside a decoding slot the batch has room for 559, and the prompt used to be cut
    there: the token at 559 then went into a micro-batch of 512 (the tiled path), its keys and
    values in the cache other bits than alone's, and every later step's logits with them. The
    server now cuts a prompt under load only where it is cut alone, so the request's top
    log-probabilities at every step are alone's, bit for bit."""
    server = start_server(ServerConfig(model=smollm2, ctx_size=8192, parallel=2, cache_prompt=False,
                                       batch_size=560, ubatch_size=512,
                                       extra_args=["--no-kv-unified", "--sparse-attn", "on", "--sparse-attn-min-kv", "0"]))
    text = reference_text()
    tokens = server.tokenize(text[:9000])[:1500]
    assert len(tokens) == 1500
    params = {"n_probs": 4, "post_sampling_probs": False}

    def top_logprobs(response: dict) -> list[list[tuple[int, float]]]:
        return [[(p["id"], p["logprob"]) for p in step["top_logprobs"]] for step in response["completion_probabilities"]]

    alone, _, loaded, _, overlap = alone_and_beside_a_decoding_slot(server, tokens, text[30000:31000], **params)
    assert alone["timings"]["prompt_n"] == loaded["timings"]["prompt_n"] == len(tokens)
    assert top_logprobs(loaded) == top_logprobs(alone), (
        f"beside a decoding slot ({overlap} of its tokens during the request) the request's top log-probabilities "
        "differ from alone's: its prompt was cut elsewhere than alone")
