"""Sparse attention's figures where llama-server users read figures: each completion's `timings`,
`/slots` and `/metrics` (Prometheus), beside the log line kept for people. A dense server adds
none of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llama_sparse import timings
from llama_sparse.gates.texts import reference_text
from llama_sparse.server import ServerConfig, ServerProcess

pytestmark = pytest.mark.slow

N_PREDICT = (24, 17)   # two requests of different lengths, so the totals cannot be one of them twice


def _prompts() -> list[str]:
    text = reference_text()
    return [text[:1800], text[20000:21800]]   # about 1,700 tokens each on the tiny model


def _sparse_series(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith(("llamacpp:sparse_", "llamacpp:scsa_"))}


def test_block_method_figures_in_timings_slots_and_metrics(start_server, tiny_qwen3: Path) -> None:
    server = start_server(ServerConfig(tiny_qwen3, ctx_size=2 * 4096, parallel=2, threads=2, cache_prompt=False,
                                       extra_args=["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--metrics"]))
    responses = []
    for prompt, n in zip(_prompts(), N_PREDICT):
        offset = server.log_size()
        resp = server.complete(prompt, n_predict=n, ignore_eos=True, id_slot=len(responses))
        sp = resp["timings"]["sparse"]
        assert sp["method"] == "block"
        # every decode step after the prompt's is sparse (the first token comes from the prompt)
        assert sp["steps_sparse"] == resp["timings"]["predicted_n"] - 1 == n - 1, sp
        assert 0 <= sp["steps_rechecked"] <= sp["steps_sparse"]
        # a sparse step reads at most half of what it sees (the ceiling); a step computed again
        # densely (the random model's steps are often in doubt) reads its visible blocks once more
        assert 0 < sp["blocks_read"] < sp["blocks_visible"] * (1 + sp["steps_rechecked"] / sp["steps_sparse"]), sp
        assert sp["read_fraction"] == pytest.approx(sp["blocks_read"] / sp["blocks_visible"])
        # the log line for people says the same
        logged = server.wait_log_until(
            lambda log: next((r for r in timings.parse(log) if r.slot == resp["id_slot"] and r.sparse_rechecked), None),
            offset=offset, what="the request's sparse log line")
        assert logged.sparse_blocks_visible == sp["blocks_visible"]
        assert logged.sparse_rechecked == (sp["steps_rechecked"], sp["steps_sparse"])
        assert timings.from_response(resp).sparse_rechecked == logged.sparse_rechecked
        responses.append(resp)

    # /slots: each slot's last request, as its response said
    slots = {s["id"]: s for s in server.request("GET", "/slots")}
    for resp in responses:
        assert slots[resp["id_slot"]]["sparse"] == resp["timings"]["sparse"]

    # /metrics: the totals of the requests finished
    series = _sparse_series(server.metrics())
    total = {k: sum(r["timings"]["sparse"][k] for r in responses)
             for k in ("blocks_visible", "blocks_read", "steps_sparse", "steps_rechecked")}
    assert series == {
        "llamacpp:sparse_blocks_visible_total": total["blocks_visible"],
        "llamacpp:sparse_blocks_read_total": total["blocks_read"],
        "llamacpp:sparse_steps_total": total["steps_sparse"],
        "llamacpp:sparse_steps_rechecked_total": total["steps_rechecked"],
    }


def test_scsa_figures_in_timings_and_metrics(start_server, tiny_qwen3: Path) -> None:
    calib_steps = 4
    server = start_server(ServerConfig(tiny_qwen3, ctx_size=4096, parallel=1, threads=2, cache_prompt=False,
                                       extra_args=["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-calib-steps", str(calib_steps),
                                                   "--scsa-rebuild-interval", "128", "--scsa-block-size", "512",
                                                   "--scsa-cluster-size", "32", "--metrics"]))
    responses = [server.complete(p, n_predict=n, ignore_eos=True) for p, n in zip(_prompts(), N_PREDICT)]
    for resp in responses:
        sp = resp["timings"]["sparse"]
        assert sp["method"] == "scsa"
        assert sp["rows_read"] == sp["rows_opened"] + sp["rows_exact"]
        assert 0 < sp["rows_read"] <= sp["rows_visible"], sp
        assert sp["read_fraction"] == pytest.approx(sp["rows_read"] / sp["rows_visible"])
    # the first request calibrates; the second finds the taus frozen
    assert responses[1]["timings"]["sparse"]["calibrated"] is True
    assert responses[1]["timings"]["sparse"]["calibration_steps"] >= calib_steps
    series = _sparse_series(server.metrics())
    assert series == {
        "llamacpp:scsa_rows_visible_total": sum(r["timings"]["sparse"]["rows_visible"] for r in responses),
        "llamacpp:scsa_rows_read_total": sum(r["timings"]["sparse"]["rows_read"] for r in responses),
        "llamacpp:scsa_calibrated": 1.0,
    }


def test_dense_server_adds_no_figures(start_server, tiny_qwen3: Path) -> None:
    server: ServerProcess = start_server(ServerConfig(tiny_qwen3, ctx_size=4096, parallel=1, threads=2,
                                                      extra_args=["--metrics"]))
    resp = server.complete(_prompts()[0], n_predict=8, ignore_eos=True)
    assert "sparse" not in resp["timings"]
    assert all("sparse" not in s for s in server.request("GET", "/slots"))
    metrics = server.metrics()
    assert "llamacpp:tokens_predicted_total" in metrics   # the scrape worked
    assert _sparse_series(metrics) == {}
    assert timings.from_response(resp).sparse_read_fraction is None
