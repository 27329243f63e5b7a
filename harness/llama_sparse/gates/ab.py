"""ab gate: same-run decode A/B of every arm against dense.

For each (model, context, KV type, batch B) every arm gets its own server (--parallel B) and
the same prompt of exactly `context - n_predict - 1` tokens (so decode ends at depth `context`), prefilled once and then reused from the prompt
cache, so a repeat costs only decode. The arms run interleaved, A B A B ..., `repeats` times;
decode tokens/s is read from each server's `eval time` log line (never from the HTTP reply).
With B > 1 the B streams run concurrently and the aggregate is their tokens over the longest
stream's decode time.

Reported per arm: median, min and max decode tokens/s; the ratio to the dense arm of the same
repeat (median, min, max); and, for arms that declare a coverage c, the bound that reading a
fraction c of the cache allows, from two dense measurements (decode step time t_0 at depth 0
and t_full at the context): bound(c) = t_full / (t_0 + c * (t_full - t_0)), and the share of
that bound reached.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

from llama_sparse import timings
from llama_sparse.errors import ArmError
from llama_sparse.gates import niah, texts
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.flags import scsa_calibration_steps
from llama_sparse.gates.needles import MAX_REUSED_TAIL, SLOT_FILE, shared_slot_args
from llama_sparse.gates.report import ArmResult
from llama_sparse.gates.schema import Arm, Kind, Threshold
from llama_sparse.server import ServerProcess

DEPTH0_TOKENS = 16


def bound(coverage: float, t0_ms: float, tfull_ms: float) -> float:
    return tfull_ms / (t0_ms + coverage * (tfull_ms - t0_ms))


# the end of a prose prompt: the decode is a summary, as a user's request about a long text
PROSE_REQUEST = "\n\nWrite a summary of the text above in a few paragraphs.\nSummary:"


def prompt_tokens(server: ServerProcess, n_tokens: int, text: str = "reference") -> list[int]:
    """Exactly n_tokens: the pinned tree's docs (`reference`), or the needle gates' prose ending in
    a request to summarise it (`prose`; the model then writes prose, where more of its steps are in
    doubt than in a continuation of docs and code)."""
    count = lambda t: len(server.tokenize(t))  # noqa: E731
    if text == "prose":
        tail = server.tokenize(PROSE_REQUEST)
        body = texts.text_of_tokens(" ".join(niah.prose_sentences()), n_tokens - len(tail) + 16, count)
        head = server.tokenize(body, add_special=True)[:n_tokens - len(tail)]
        toks = head + tail
    else:
        body = texts.text_of_tokens(texts.reference_text(), n_tokens + 16, count)
        toks = server.tokenize(body, add_special=True)[:n_tokens]
    if len(toks) < n_tokens:
        raise ArmError(f"could not build a prompt of {n_tokens} tokens")
    return toks


def warmup_tokens(arm: Arm) -> int:
    """Tokens the first round decodes: one (the prefill), or for an SCSA arm its calibration
    window too, so that the timed repeats measure the calibrated operator."""
    return 1 + scsa_calibration_steps(arm)


def decode_round(server: ServerProcess, prompt: list[int], batch: int, n_predict: int) -> dict:
    """B concurrent greedy requests; the decode figures of this round from their responses
    (a sparse arm's read fraction and steps computed again from each response's `timings`)."""
    with ThreadPoolExecutor(batch) as pool:
        futures = [pool.submit(server.complete, prompt, n_predict, ignore_eos=True) for _ in range(batch)]
        recs = [timings.from_response(f.result()) for f in futures]
    fractions = [r.sparse_read_fraction for r in recs if r.sparse_read_fraction is not None]
    rechecked = [r.sparse_rechecked for r in recs if r.sparse_rechecked is not None]
    tokens = sum(r.decode.tokens for r in recs)
    longest_ms = max(r.decode.ms for r in recs)
    return {"tokens": tokens, "ms": longest_ms, "tps": 1000.0 * tokens / longest_ms if longest_ms > 0 else 0.0,
            "ms_per_token": longest_ms / max(1, max(r.decode.tokens for r in recs)),
            "prompt_tokens_evaluated": [r.prompt.tokens if r.prompt else 0 for r in recs],
            "read_fraction": statistics.mean(fractions) if fractions else None,
            # the share of sparse steps computed again densely (--sparse-attn-recheck): their cost is in the time
            "rechecked_fraction": (sum(n for n, _ in rechecked) / sum(m for _, m in rechecked)
                                   if rechecked and sum(m for _, m in rechecked) > 0 else None)}


def measure(ctx: GateContext, model: str, n_ctx: int, cache: str, batch: int, arms: list[Arm],
            dense: Arm, n_predict: int | None = None) -> list[ArmResult]:
    """One interleaved A/B block; returns one result per arm (errors kept per arm).
    `n_predict`: tokens decoded per round (the gate's n_predict when None)."""
    spec = ctx.spec
    n_predict = n_predict or spec.n_predict
    results = {a.name: ArmResult(a.name, model, n_ctx, cache, batch=batch) for a in arms}
    task = ctx.progress.task(f"ab {model} @{n_ctx} {cache} B{batch}", total=len(arms) * (spec.repeats + 1) + 1)
    with ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        prompt: list[int] | None = None
        slots = ctx.out_dir / "slots"
        saved = False
        for arm in arms:
            try:
                # the decode steps end at depth n_ctx: models are served at most at their
                # training context, so "8K" on an 8K model must fit prompt and answer in 8192
                cfg = ctx.server_config(arm, model, batch * n_ctx, cache, parallel=batch)
                if spec.shared_prefill:
                    cfg.extra_args += shared_slot_args(slots)
                server = stack.enter_context(ServerProcess(cfg, ctx.log_path("ab", arm.name, model, n_ctx, cache, f"B{batch}")))
                if prompt is None:
                    prompt = prompt_tokens(server, n_ctx - n_predict - 1, spec.prompt_text)
                if saved:
                    server.request("POST", "/slots/0?action=restore", json={"filename": SLOT_FILE})
                warm = decode_round(server, prompt, batch, warmup_tokens(arm))  # prefill once; later rounds reuse it
                if saved and max(warm["prompt_tokens_evaluated"]) > MAX_REUSED_TAIL:
                    raise ArmError(f"arm {arm.name}: the restored prefill was not reused "
                                   f"({max(warm['prompt_tokens_evaluated'])} prompt tokens evaluated)")
                if spec.shared_prefill and not saved:
                    server.request("POST", "/slots/0?action=save", json={"filename": SLOT_FILE})
                    saved = True
                servers[arm.name] = server
            except ArmError as e:
                results[arm.name].fail(str(e))
            task.advance()
        if saved:
            (slots / SLOT_FILE).unlink(missing_ok=True)
        rounds: dict[str, list[dict]] = {a.name: [] for a in arms}
        for r in range(spec.repeats):
            for arm in arms:
                if arm.name not in servers:
                    continue
                try:
                    rounds[arm.name].append(decode_round(servers[arm.name], prompt, batch, n_predict))
                except ArmError as e:
                    results[arm.name].fail(str(e))
                    servers.pop(arm.name).stop()
                task.advance()
        # t_0: dense decode step time at (almost) no depth, for the bound column and the time a
        # step spends on its context
        t0_ms = None
        if dense.name in servers:
            short = [dense_round["ms_per_token"] for dense_round in
                     (decode_round(servers[dense.name], prompt[:DEPTH0_TOKENS], 1, n_predict) for _ in range(3))]
            t0_ms = statistics.median(short)
        task.advance()

    dense_rounds = rounds.get(dense.name, [])
    for arm in arms:
        res = results[arm.name]
        res.samples = rounds[arm.name]
        if res.error is not None:
            continue
        tps = [x["tps"] for x in rounds[arm.name]]
        res.metrics = {"decode_tps_median": statistics.median(tps), "decode_tps_min": min(tps),
                       "decode_tps_max": max(tps), "repeats": float(len(tps))}
        fractions = [x["read_fraction"] for x in rounds[arm.name] if x["read_fraction"] is not None]
        if fractions:
            res.metrics["read_fraction"] = statistics.median(fractions)
        rechecked = [x["rechecked_fraction"] for x in rounds[arm.name] if x.get("rechecked_fraction") is not None]
        if rechecked:
            res.metrics["rechecked_fraction"] = statistics.median(rechecked)
        if len(dense_rounds) == len(tps) and results[dense.name].error is None:
            ratios = [x["tps"] / d["tps"] for x, d in zip(rounds[arm.name], dense_rounds)]
            res.metrics.update(ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios))
            if t0_ms:
                # the part of a step that grows with the context: attention, the selection and
                # the steps computed again, over the same part of dense's step
                ms = statistics.median(x["ms_per_token"] for x in rounds[arm.name])
                dense_ms = statistics.median(d["ms_per_token"] for d in dense_rounds)
                res.metrics.update(context_ms=ms - t0_ms)
                if ms - t0_ms > 0 and dense_ms - t0_ms > 0:
                    res.metrics.update(context_ratio=(dense_ms - t0_ms) / (ms - t0_ms))
            if arm.coverage and t0_ms:
                tfull = statistics.median(d["ms_per_token"] for d in dense_rounds)
                b = bound(arm.coverage, t0_ms, tfull)
                res.metrics.update(bound=b, bound_share=res.metrics["ratio_median"] / b, t0_ms=t0_ms, tfull_ms=tfull)
    return [results[a.name] for a in arms]


def run(ctx: GateContext) -> None:
    dense = ctx.dense_arm()
    for model, n_ctx, cache in ctx.points():
        for batch in ctx.spec.batch:
            for res in measure(ctx, model, n_ctx, cache, batch, ctx.arms, dense):
                ctx.record_speed(res, f"{model} @{n_ctx} {cache} B{batch}", lambda m: f"{m['decode_tps_median']:.1f} tok/s")


KIND = Kind(
    "ab", run, keys=("repeats", "batch", "prompt_text", "shared_prefill"),
    # two identical dense arms differ by up to 10% in decode speed with 2 repeats
    min_repeats=5,
    thresholds={
        "min_ratio": Threshold("median decode speed of a sparse arm over the dense one", "ratio_median", "min",
                               0, low_open=True, sparse_only=True),
        "min_bound_share": Threshold("share of the coverage bound a sparse arm reaches", "bound_share", "min",
                                     0, 1, sparse_only=True),
    })
