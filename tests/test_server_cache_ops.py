"""llama-server's own cache operations with sparse attention on: slot save and restore with
prompt-cache reuse, and context shift. The select-all arm must answer exactly like dense (same
tokens, same top probabilities) through each; a top-K arm must keep serving."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from llama_sparse.gates.texts import reference_text
from llama_sparse.server import ServerConfig

pytestmark = pytest.mark.slow

SELECT_ALL = ["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-topk", "1048576"]
TOP_K = ["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-coverage", "0.25", "--sparse-attn-recent", "32"]


def answers(resp: dict) -> tuple:
    probs = [(p.get("id"), [(t.get("id"), t.get("prob", t.get("logprob"))) for t in p.get("top_probs", p.get("top_logprobs", []))])
             for p in resp.get("completion_probabilities", [])]
    return resp["content"], probs


def save_restore_sequence(start_server, model: Path, tmp_path: Path, name: str, flags: list[str]) -> list[tuple]:
    slots = tmp_path / f"slots-{name}"
    slots.mkdir()
    server = start_server(ServerConfig(model=model, ctx_size=4096, extra_args=["--slot-save-path", f"{slots}/", *flags]),
                          name=name)
    text = reference_text()
    first, other = text[:6000], text[20000:26000]
    out = []
    a = server.complete(first, n_predict=16, n_probs=3, id_slot=0)
    out.append(answers(a))
    server.request("POST", "/slots/0?action=save", json={"filename": "slot0.bin"})
    out.append(answers(server.complete(other, n_predict=16, n_probs=3, id_slot=0)))   # the slot now holds another prompt
    server.request("POST", "/slots/0?action=restore", json={"filename": "slot0.bin"})
    c = server.complete(first + a["content"] + " Then", n_predict=16, n_probs=3, id_slot=0)
    out.append(answers(c))
    # the restored cache was reused: only the new tail was evaluated
    assert c["timings"]["prompt_n"] < 64, c["timings"]
    return out


def test_slot_save_restore_and_prompt_reuse(start_server, smollm2: Path, tmp_path: Path) -> None:
    dense = save_restore_sequence(start_server, smollm2, tmp_path, "dense", [])
    select_all = save_restore_sequence(start_server, smollm2, tmp_path, "select-all", SELECT_ALL)
    assert dense == select_all
    top_k = save_restore_sequence(start_server, smollm2, tmp_path, "top-k", TOP_K)
    assert all(content for content, _ in top_k)


def test_restore_rebuilds_only_the_restored_slot(start_server, smollm2: Path, tmp_path: Path) -> None:
    """A slot restored into a cache it shares with another slot (llama-server's unified cache)
    rebuilds the key bounds of its own blocks only: the blocks of the cells it freed and of those
    it wrote, not the other slot's long prompt; in pieces of bounded host memory."""
    slots = tmp_path / "slots"
    slots.mkdir()
    server = start_server(ServerConfig(model=smollm2, ctx_size=8192, parallel=2,
                                       extra_args=["--kv-unified", "--slot-save-path", f"{slots}/", "--sparse-attn", "on", "--sparse-attn-min-kv", "0",
                                                   "-v"]))  # -v: llama's own lines are below the default verbosity
    block = int(server.wait_log_until(lambda log: (m := re.search(r"key bounds.*\(block (\d+),", log)) and m.group(1),
                                      what="the key bounds' block size"))
    text = reference_text()
    long = server.complete(text[:24000], n_predict=4, id_slot=0)["timings"]["prompt_n"]
    server.complete(text[30000:33000], n_predict=4, id_slot=1)
    server.request("POST", "/slots/1?action=save", json={"filename": "slot1.bin"})
    offset = server.log_size()
    restored = server.request("POST", "/slots/1?action=restore", json={"filename": "slot1.bin"})["n_restored"]
    found = server.wait_log_until(
        lambda log: re.search(r"rebuilt the key bounds of (\d+) blocks after the restore in [\d.]+ ms, (\d+) piece\(s\) of at most", log),
        offset, what="the restore's rebuild line")
    rebuilt, pieces = int(found.group(1)), int(found.group(2))
    print(f"slot 1: {restored} cells restored beside slot 0's {long}: {rebuilt} blocks of {block} rebuilt in {pieces} piece(s)")
    own = math.ceil(restored/block) + 1  # the blocks its cells span (one more where they straddle a boundary)
    assert 0 < rebuilt <= 2*own, (f"a restore of {restored} cells rebuilt {rebuilt} blocks of {block} cells"
                                  f" (the other slot's {long} cells span {math.ceil(long/block)})")
    assert 1 <= pieces <= rebuilt
    # the slot serves on from its restored cache
    after = server.complete(text[30000:33000] + " And", n_predict=4, id_slot=1)
    assert after["timings"]["prompt_n"] < 16 and after["content"]


def test_a_prompt_found_whole_in_the_cache_answers_from_a_dense_row(start_server, smollm2: Path) -> None:
    """llama-server evaluates the last token of a prompt it finds whole in its cache again, alone
    in its batch, for the logits of the answer's first token. That row is a prompt's, read as a
    prefill reads it: the first token's probabilities are a dense server's for the same request,
    bit for bit, and the request counts no sparse step (the recheck is off, so a sparse row would
    stay sparse)."""
    text = reference_text()[:6000]

    def served_again(name: str, flags: list[str]) -> dict:
        server = start_server(ServerConfig(model=smollm2, ctx_size=4096, extra_args=flags), name=name)
        server.complete(text, n_predict=1, n_probs=5, id_slot=0)
        again = server.complete(text, n_predict=1, n_probs=5, id_slot=0)
        assert again["timings"]["prompt_n"] == 1, "the prompt was not found whole in the cache"
        return again

    dense = served_again("dense", [])
    sparse = served_again("top-k", [*TOP_K, "--sparse-attn-recheck", "0"])
    assert sparse["timings"]["sparse"]["steps_sparse"] == 0, (
        f"the cached prompt's last token was read as a decode step: {sparse['timings']['sparse']}")
    assert answers(sparse) == answers(dense)


def context_shift_run(start_server, model: Path, name: str, flags: list[str]) -> tuple[str, str]:
    server = start_server(ServerConfig(model=model, ctx_size=1024, extra_args=["--context-shift", *flags]), name=name)
    prompt = reference_text()[:1500]
    r = server.complete(prompt, n_predict=450, ignore_eos=True, n_keep=32)
    assert r["tokens_predicted"] == 450
    # a request's last log line: the sparse read fraction with sparse attention on, else its total time
    return r["content"], server.wait_log("sparse attention: decode read" if flags else "total time")


def test_context_shift(start_server, smollm2: Path) -> None:
    dense, dense_log = context_shift_run(start_server, smollm2, "dense", [])
    select_all, log = context_shift_run(start_server, smollm2, "select-all", SELECT_ALL)
    assert "slot context shift" in dense_log and "slot context shift" in log
    first_diff = next((i for i, (a, b) in enumerate(zip(dense, select_all)) if a != b), None)
    assert dense == select_all, f"select-all departs from dense at character {first_diff} of {len(dense)}"
    top_k, log = context_shift_run(start_server, smollm2, "top-k", TOP_K)
    assert "slot context shift" in log and "sparse attention: decode read" in log and len(top_k) > 0
