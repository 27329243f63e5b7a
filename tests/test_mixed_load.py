"""Sound under the load a server meets: greedy requests beside sampled ones, one constrained by a
JSON schema and one sampled on the backend, arriving and ending at different times on a
`--parallel 4` server (a KV stream per slot). Each request must be computed again on the steps it
is computed again alone (the recheck is decided per sequence) and answer as it does alone.

Before: one slot's doubt took the whole batch back, so under load every request counted the others'
steps computed again as its own (and was computed densely on them), and the one request with backend
sampling switched the recheck off for every slot's batches."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from llama_sparse import timings
from llama_sparse.gates.texts import reference_text
from llama_sparse.server import ServerConfig, ServerProcess

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}

# (name, request parameters)
REQUESTS = [
    ("greedy", {"n_predict": 40}),
    ("json", {"n_predict": 36, "json_schema": SCHEMA}),
    ("sampled", {"n_predict": 32, "temperature": 0.7, "top_k": 40, "seed": 7}),
    ("backend", {"n_predict": 28, "temperature": 0.7, "top_k": 40, "seed": 11, "backend_sampling": True}),
    ("greedy-late", {"n_predict": 20}),
]


def _prompt(i: int) -> str:
    text = reference_text()
    return text[i * 9000:i * 9000 + 1800]  # about 1,700 tokens of the tiny model


def _rechecked(resp: dict) -> tuple[int, int]:
    """(steps computed again densely, sparse steps) of one request, from its response's timings."""
    rec = timings.from_response(resp)
    assert rec.sparse_rechecked is not None, f"no sparse figures in the response's timings: {resp['timings']}"
    return rec.sparse_rechecked


def _alone(server: ServerProcess) -> dict[str, tuple[str, tuple[int, int]]]:
    out = {}
    for i, (name, params) in enumerate(REQUESTS):
        resp = server.complete(_prompt(i), **params)
        out[name] = (resp["content"], _rechecked(resp))
    return out


def _under_load(server: ServerProcess) -> dict[str, tuple[str, tuple[int, int]]]:
    responses: dict[str, dict] = {}

    def send(i: int, name: str, params: dict) -> None:
        time.sleep(0.4 * i)   # arriving while the others decode; their lengths differ, so they end apart
        responses[name] = server.complete(_prompt(i), **params)

    threads = [threading.Thread(target=send, args=(i, name, params)) for i, (name, params) in enumerate(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {name: (resp["content"], _rechecked(resp)) for name, resp in responses.items()}


def test_each_request_under_mixed_load_is_computed_again_where_it_is_alone(start_server, tiny_qwen3: Path) -> None:
    cfg = ServerConfig(tiny_qwen3, ctx_size=4 * 2560, parallel=4, threads=2, cache_prompt=False,
                       extra_args=["--sparse-attn", "on", "--sparse-attn-min-kv", "0"])
    server = start_server(cfg, "mixed")
    alone = _alone(server)
    load = _under_load(server)
    # the case means something: the requests are in doubt on some steps (a random model's often are)
    assert sum(alone[n][1][0] for n, _ in REQUESTS if n != "backend") >= 5, alone
    for name, params in REQUESTS:
        if params.get("temperature", 0) > 0 and not params.get("backend_sampling"):
            # a draw near a boundary of the cumulative probabilities can follow a batch's last bits
            # (dense's too): where the text is the same, so is the recheck
            if load[name][0] == alone[name][0]:
                assert load[name][1] == alone[name][1], (name, load[name][1], alone[name][1])
            continue
        # the same answer (greedy, constrained, and the backend-sampled one, whose step is never
        # taken back), computed again on the steps it is alone
        assert load[name][0] == alone[name][0], (name, load[name][0], alone[name][0])
        assert load[name][1] == alone[name][1], (name, load[name][1], alone[name][1])
    assert alone["backend"][1][0] == 0 and load["backend"][1][0] == 0
