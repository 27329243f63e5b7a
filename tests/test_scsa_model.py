"""SCSA on real models: with every cluster opened and f16 packing it is dense attention (within
the noise of another summation order), calibration writes taus that load back, and plans never outlive the keys they
summarise (a prompt that reuses part of the cache replans and still agrees with dense)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from llama_sparse.gates import logitsdump, texts
from llama_sparse.server import ServerConfig
from llama_sparse.timings import SCSA_LINE

pytestmark = pytest.mark.slow

TAU_GRID = {0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3}
TOOL_LINE = re.compile(r"scsa: calls (?P<calls>\d+), read \d+ of \d+ visible rows \(opened (?P<opened>\d+), "
                       r"exact \d+\), rebuilds \d+, exact calls (?P<exact_calls>\d+), calibration (?P<calib>\d+) steps, "
                       r"(?P<state>taus frozen|calibrating)")
SMALL_PLANS = ["--scsa-rebuild-interval", "128", "--scsa-block-size", "512", "--scsa-cluster-size", "32"]


def taus_file(path: Path, n_layer: int, n_head: int, tau: float) -> Path:
    path.write_text(json.dumps({f"{il}:{h}": tau for il in range(n_layer) for h in range(n_head)}))
    return path


def dump(model: Path, tmp_path: Path, name: str, flags: list[str], ctx: int = 2048, steps: int = 24,
         force: Path | None = None, threads: int = 2) -> logitsdump.LogitsDump:
    prompt = tmp_path / "prompt.txt"
    if not prompt.exists():
        prompt.write_text(texts.reference_text()[: 8 * ctx])
    req = logitsdump.DumpRequest(model=model, prompt_file=prompt, ctx_size=ctx, steps=steps,
                                 out=tmp_path / f"{name}.bin", flags=tuple(flags), force=force,
                                 prompt_tokens=ctx - steps - 1, threads=threads)
    return logitsdump.run(req, tmp_path / f"{name}.log")


# (cache type, packing that holds the cache's values exactly): a q8_0 row requantizes to itself
CACHES = {"f16": ("f16", "f16"), "q8_0": ("q8_0", "q8_0")}


@pytest.mark.parametrize("cache", list(CACHES))
@pytest.mark.parametrize("model_name,n_layer,n_head", [("tiny_qwen3", 2, 8), ("smollm2", 30, 9)])
def test_every_cluster_opened_with_exact_packing_is_dense(model_name, n_layer, n_head, cache, request, tmp_path) -> None:
    """On an f16 cache with f16 packing, and on a q8_0 cache (--cache-type-k/v q8_0) with q8_0
    packing, tau 0 is dense attention over the same cache."""
    model = request.getfixturevalue(model_name)
    kv_type, packed = CACHES[cache]
    kv = ["-ctk", kv_type, "-ctv", kv_type]
    dense = dump(model, tmp_path, "dense", kv)
    stream = tmp_path / "stream.bin"
    dense.tokens[:-1].astype(np.int32).tofile(stream)
    tau0 = taus_file(tmp_path / "tau0.json", n_layer, n_head, 0.0)
    # the plans alone, without the recheck: it would give the thin steps back to dense, which
    # another summation order can tip as it tips dense's own
    plans = ["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--sparse-attn-recheck", "0"]
    exact = dump(model, tmp_path, "scsa-tau0", [*kv, *plans, "--scsa-packed", packed,
                                                "--scsa-taus", str(tau0), *SMALL_PLANS], force=stream)
    # (no audits: they would tighten the loose taus in the first steps)
    loose = dump(model, tmp_path, "scsa-tau03", [*kv, *plans, "--scsa-calib-steps", "0",
                                                 "--scsa-taus", str(taus_file(tmp_path / "t.json", n_layer, n_head, 0.3)),
                                                 "--scsa-audit-steps", "0", *SMALL_PLANS], force=stream)
    # the noise floor: dense itself on one thread instead of two (another summation order). On
    # SmolLM2 (q4_1 weights) that alone moves the logits by up to ~1 and KL ~1e-3
    floor = logitsdump.compare(dense, dump(model, tmp_path, "dense-1t", kv, force=stream, threads=1), skip=1)
    if floor["kl_mean"] == 0.0 and cache != "f16":
        # flash attention over a q8_0 cache sums in the same order at any thread count, so the
        # floor of another summation order is taken where it shows, on the f16 cache of the same model
        f16_kv = ["-ctk", "f16", "-ctv", "f16"]
        dense_f16 = dump(model, tmp_path, "dense-f16", f16_kv, force=stream)
        floor = logitsdump.compare(dense_f16, dump(model, tmp_path, "dense-f16-1t", f16_kv, force=stream, threads=1), skip=1)
    m_exact = logitsdump.compare(dense, exact, skip=1)
    m_loose = logitsdump.compare(dense, loose, skip=1)
    # one near-tie may flip within that noise (SmolLM2 on q8_0: 23 of 24 steps, KL 1.9e-3)
    assert m_exact["top1"] >= (1.0 if cache == "f16" else 0.95), (m_exact, floor)
    assert m_exact["kl_mean"] <= max(4 * floor["kl_mean"], 1e-5), (m_exact, floor)
    # the plans are in use: a loose threshold moves the distributions far more than rounding does
    assert m_loose["kl_mean"] > 10 * max(m_exact["kl_mean"], 1e-9), (m_exact, m_loose)
    # the loaded taus were used from the first step: no calibration (exact) calls, clusters opened;
    # a head at tau 0 is already exact, so no audit computes it again
    run = TOOL_LINE.search((tmp_path / "scsa-tau0.log").read_text())
    assert run and int(run["exact_calls"]) == 0 and run["state"] == "taus frozen" and int(run["opened"]) > 0, run


def test_calibration_writes_taus_that_load_back(tiny_qwen3, tmp_path) -> None:
    out = tmp_path / "taus.json"
    dump(tiny_qwen3, tmp_path, "calibrate", ["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-calib-steps", "8",
                                             "--scsa-taus-out", str(out), *SMALL_PLANS], steps=16)
    taus = json.loads(out.read_text())
    assert set(taus) == {f"{il}:{h}" for il in range(2) for h in range(8)}
    assert all(v in TAU_GRID | {0.0} for v in taus.values()), taus   # the grid, or 0 for a head none meets
    run = TOOL_LINE.search((tmp_path / "calibrate.log").read_text())
    assert run and int(run["calib"]) == 8 and run["state"] == "taus frozen", run
    assert int(run["exact_calls"]) == 8 * 2 * 8      # 8 steps x 2 layers x 8 heads ran exact

    dump(tiny_qwen3, tmp_path, "load", ["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-taus", str(out),
                                        "--scsa-audit-steps", "0", *SMALL_PLANS], steps=4)
    run = TOOL_LINE.search((tmp_path / "load.log").read_text())
    assert run and int(run["exact_calls"]) == 0 and int(run["calib"]) == 0 and run["state"] == "taus frozen", run

    # loaded taus are audited as calibrated ones are: the first 2 steps after the prompt run exact
    # for every head whose tau is not 0 (a head at 0 is exact already), the steps after go through
    # the plans, and nothing calibrates
    loose = sum(1 for v in taus.values() if v > 0.0)
    assert loose > 0, taus
    dump(tiny_qwen3, tmp_path, "audited", ["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-taus", str(out),
                                           "--scsa-audit-steps", "2", *SMALL_PLANS], steps=4)
    run = TOOL_LINE.search((tmp_path / "audited.log").read_text())
    assert run and int(run["exact_calls"]) == 2 * loose and int(run["calib"]) == 0 and run["state"] == "taus frozen", (run, loose)


@pytest.mark.parametrize("strict", [["--scsa-tolerance", "1e-9"], ["--scsa-max-error", "1e-6"]],
                         ids=["median-tolerance", "worst-step"])
def test_a_head_no_tau_serves_runs_exact(strict, tiny_qwen3, tmp_path) -> None:
    # a limit no tau on the grid can meet (the median's, or the worst step's, which also proves the
    # flag reaches the operator): every head must freeze tau 0 (every cluster opened), never a
    # default threshold looser than the calibrated ones
    out = tmp_path / "taus.json"
    dump(tiny_qwen3, tmp_path, "strict", ["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-calib-steps", "4", *strict,
                                          "--scsa-taus-out", str(out), *SMALL_PLANS], steps=8)
    taus = json.loads(out.read_text())
    assert len(taus) == 2 * 8 and set(taus.values()) == {0.0}, taus


def test_prompt_reusing_part_of_the_cache_replans(tiny_qwen3, start_server, tmp_path) -> None:
    """Request 2 keeps request 1's first 600 tokens from the cache and replaces the rest: the
    plans over the replaced cells must go. With every cluster opened and f16 packing, SCSA's
    answer then matches dense's (tiny-qwen3: no q4 weights to amplify rounding); a plan left
    over the old keys would not."""
    text = texts.reference_text()
    tau0 = taus_file(tmp_path / "tau0.json", 2, 8, 0.0)
    common = ["--scsa-packed", "f16", "--scsa-taus", str(tau0), *SMALL_PLANS]
    servers = {
        "dense": start_server(ServerConfig(model=tiny_qwen3, ctx_size=4096, threads=2), "dense"),
        "scsa": start_server(ServerConfig(model=tiny_qwen3, ctx_size=4096, threads=2,
                                          extra_args=["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", *common]), "scsa"),
    }
    first = servers["dense"].tokenize(text[:3000])[:2400]
    second = first[:600] + servers["dense"].tokenize(text[6000:9000])[:1800]
    answers = {}
    for name, server in servers.items():
        server.complete(first, n_predict=8)
        answers[name] = server.complete(second, n_predict=24, n_probs=5)
    assert answers["scsa"]["tokens_evaluated"] == answers["dense"]["tokens_evaluated"]
    reused = answers["scsa"].get("tokens_cached", 0)
    assert reused >= 600, f"the second prompt did not reuse the cache ({reused} tokens cached)"
    assert answers["scsa"]["content"] == answers["dense"]["content"]
    for a, b in zip(answers["dense"]["completion_probabilities"], answers["scsa"]["completion_probabilities"]):
        la = {t["id"]: t["logprob"] for t in a["top_logprobs"]}
        lb = {t["id"]: t["logprob"] for t in b["top_logprobs"]}
        assert set(la) == set(lb)
        for tok in la:
            assert abs(la[tok] - lb[tok]) < 5e-3, (tok, la[tok], lb[tok])   # dense accumulates V in f16
    lines = list(SCSA_LINE.finditer(servers["scsa"].wait_log("scsa: decode read", count=2)))
    assert len(lines) == 2 and lines[1]["rebuilds"] is not None, [m.group(0) for m in lines]
    rebuilds_second = int(lines[1]["rebuilds"])
    assert rebuilds_second > 0, "the second request built no plan over its new keys"


def host_context_mib(log: str) -> float:
    """The Host row's context column of the memory breakdown llama-server prints at exit."""
    rows = [ln for ln in log.splitlines() if "memory_breakdown_print" in ln and "- Host" in ln]
    assert rows, "no memory breakdown in the log"
    # | - Host | total = model + context + compute |
    numbers = re.findall(r"\d+", rows[-1].split("- Host")[1])
    return float(numbers[2])


def test_memory_breakdown_counts_the_plans(tiny_qwen3, start_server) -> None:
    """SCSA's plans are context memory in host RAM (packed keys and values, cluster summaries):
    the memory breakdown the server prints at exit, which --fit sizes a context with, counts them
    at the size they can reach, and each request's log line shows what they hold, never more."""
    text = texts.reference_text()
    # -v: the breakdown and llama's own lines are logged below the server's default verbosity
    servers = {
        "dense": start_server(ServerConfig(model=tiny_qwen3, ctx_size=4096, threads=2, extra_args=["-v"]), "dense"),
        "scsa": start_server(ServerConfig(model=tiny_qwen3, ctx_size=4096, threads=2,
                                          extra_args=["-v", "--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", *SMALL_PLANS]), "scsa"),
    }
    prompt = servers["dense"].tokenize(text[:16000])[:3000]
    for server in servers.values():
        server.complete(prompt, n_predict=8)
    log = servers["scsa"].wait_log("scsa: decode read")
    held = float(re.search(r"; plans ([0-9.]+) MiB", log).group(1))
    reach = float(re.search(r"up to ([0-9.]+) MiB of host memory at 4096 cells", log).group(1))
    assert 0 < held <= reach, (held, reach)
    for server in servers.values():
        server.stop()
    dense = host_context_mib(servers["dense"].log_path.read_text(errors="replace"))
    scsa = host_context_mib(servers["scsa"].log_path.read_text(errors="replace"))
    assert abs((scsa - dense) - reach) <= 1.0, (dense, scsa, reach)   # the table rounds to whole MiB
