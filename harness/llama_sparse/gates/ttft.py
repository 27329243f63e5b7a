"""ttft gate: same-run time to first token (the prompt's evaluation) of every arm against dense.

For each (model, context, KV type) every arm gets its own server and the same prompt of exactly
`context - n_predict - 1` tokens. The arms run interleaved, A B A B ..., `repeats` times; every
request evaluates the whole prompt (`cache_prompt` off), so each repeat is a prefill. Figures come
from each response's `timings` (`prompt_ms`, `predicted_ms`), never from log text.

Reported per arm: the median prompt time and its ratio to dense's in the same repeat (median, min,
max); the end-to-end ratio (prompt plus the `n_predict` tokens decoded); how many of the first
generated tokens equal dense's (greedy, so a divergence is the prefill's doing, or the decode's
when it is sparse too). For dense, the share of its prompt time that grows with the context
(attention): one minus the time the same server takes per token on a short prompt
(`SHORT_PROMPT` tokens, where attention is negligible) times the prompt's length, over its time.
"""

from __future__ import annotations

import statistics
from contextlib import ExitStack

from llama_sparse import timings
from llama_sparse.errors import ArmError
from llama_sparse.gates.ab import prompt_tokens
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.report import ArmResult
from llama_sparse.gates.schema import Arm, Kind, Threshold
from llama_sparse.server import ServerProcess

SHORT_PROMPT = 512


def prefill_round(server: ServerProcess, prompt: list[int], n_predict: int) -> dict:
    """One request that evaluates the whole prompt; its prompt and decode times and tokens."""
    resp = server.complete(prompt, n_predict, ignore_eos=True, cache_prompt=False, return_tokens=True)
    t = resp.get("timings") or {}
    if int(t.get("prompt_n", 0)) != len(prompt):
        raise ArmError(f"the server evaluated {t.get('prompt_n')} of the prompt's {len(prompt)} tokens: "
                       "a prompt cache answered, so this is no prefill")
    prompt_ms, predicted_ms = float(t["prompt_ms"]), float(t.get("predicted_ms", 0.0))
    return {"prompt_tokens": len(prompt), "prompt_ms": prompt_ms, "predicted_ms": predicted_ms,
            "total_ms": prompt_ms + predicted_ms, "tokens": list(resp.get("tokens") or []),
            # the KV blocks the prompt's rows read of those they could see (every layer and KV head;
            # rows before --sparse-attn-min-kv count as dense reads nowhere: they are not counted)
            "prefill_read_fraction": timings.from_response(resp).prefill_read_fraction}


def leading_agreement(a: list[int], b: list[int]) -> int:
    """How many leading tokens two generations share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def measure(ctx: GateContext, model: str, n_ctx: int, cache: str, arms: list[Arm], dense: Arm) -> list[ArmResult]:
    spec = ctx.spec
    results = {a.name: ArmResult(a.name, model, n_ctx, cache) for a in arms}
    rounds: dict[str, list[dict]] = {a.name: [] for a in arms}
    task = ctx.progress.task(f"ttft {model} @{n_ctx} {cache}", total=len(arms) * (spec.repeats + 1) + 1)
    short_ms: float | None = None
    with ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        prompt: list[int] | None = None
        for arm in arms:
            try:
                cfg = ctx.server_config(arm, model, n_ctx, cache)
                servers[arm.name] = stack.enter_context(ServerProcess(cfg, ctx.log_path("ttft", arm.name, model, n_ctx, cache)))
                if prompt is None:
                    prompt = prompt_tokens(servers[arm.name], n_ctx - spec.n_predict - 1, spec.prompt_text)
            except ArmError as e:
                results[arm.name].fail(str(e))
            task.advance()
        for _ in range(spec.repeats):
            for arm in arms:
                if arm.name not in servers:
                    continue
                try:
                    rounds[arm.name].append(prefill_round(servers[arm.name], prompt, spec.n_predict))
                except ArmError as e:
                    results[arm.name].fail(str(e))
                    servers.pop(arm.name).stop()
                task.advance()
        if dense.name in servers and prompt is not None and len(prompt) > SHORT_PROMPT:
            short = [prefill_round(servers[dense.name], prompt[:SHORT_PROMPT], 1)["prompt_ms"] for _ in range(3)]
            short_ms = statistics.median(short)
        task.advance()

    dense_rounds = rounds.get(dense.name, [])
    for arm in arms:
        res = results[arm.name]
        res.samples = [{k: v for k, v in r.items() if k != "tokens"} for r in rounds[arm.name]]
        if res.error is not None:
            continue
        ms = [r["prompt_ms"] for r in rounds[arm.name]]
        n = rounds[arm.name][0]["prompt_tokens"]
        res.metrics = {"prompt_ms_median": statistics.median(ms), "prompt_ms_min": min(ms), "prompt_ms_max": max(ms),
                       "prompt_tps_median": 1000.0 * n / statistics.median(ms), "repeats": float(len(ms))}
        fractions = [r["prefill_read_fraction"] for r in rounds[arm.name] if r["prefill_read_fraction"] is not None]
        if fractions:
            res.metrics["prefill_read_fraction"] = statistics.median(fractions)
        if arm.name == dense.name and short_ms:
            # the part of dense's prefill that is not the weights' (their cost per token measured
            # on a short prompt): attention, which grows with the context
            res.metrics["attention_share"] = max(0.0, 1.0 - n * short_ms / SHORT_PROMPT / statistics.median(ms))
        if len(dense_rounds) == len(ms) and results[dense.name].error is None:
            ratios = [d["prompt_ms"] / r["prompt_ms"] for r, d in zip(rounds[arm.name], dense_rounds)]
            e2e = [d["total_ms"] / r["total_ms"] for r, d in zip(rounds[arm.name], dense_rounds)]
            agree = [leading_agreement(r["tokens"], d["tokens"]) for r, d in zip(rounds[arm.name], dense_rounds)]
            res.metrics.update(ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                               e2e_ratio_median=statistics.median(e2e), agree_tokens_min=float(min(agree)),
                               n_predict=float(spec.n_predict))
    return [results[a.name] for a in arms]


def run(ctx: GateContext) -> None:
    dense = ctx.dense_arm()
    for model, n_ctx, cache in ctx.points():
        for res in measure(ctx, model, n_ctx, cache, ctx.arms, dense):
            ctx.record_speed(res, f"{model} @{n_ctx} {cache}", lambda m: f"prompt {m['prompt_ms_median'] / 1000:.1f} s")


KIND = Kind(
    "ttft", run, keys=("repeats", "prompt_text"), n_predict=32,
    thresholds={
        "min_ratio": Threshold("median prompt speed of a sparse arm over the dense one", "ratio_median", "min",
                               0, low_open=True, sparse_only=True),
        "min_agree_tokens": Threshold("leading generated tokens every repeat of a sparse arm shares with dense",
                                      "agree_tokens_min", "min", 0, integer=True, sparse_only=True),
    })
