"""niah gate: RULER needle retrieval per arm, context length and KV cache type.

Samples are generated once per (model, context) with the model's own tokenizer (the server's
/tokenize) and shared by every arm, so arms answer the same questions. Each answer is up to
n_predict greedy tokens, scored by case-insensitive substring match. A server that dies is an
error of that arm, with the samples answered so far kept; never a score.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from llama_sparse import timings
from llama_sparse.errors import ArmError
from llama_sparse.gates import niah
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.flags import scsa_calibration_steps
from llama_sparse.gates.report import ArmResult, compare_needles
from llama_sparse.gates.schema import Arm, Kind, Threshold
from llama_sparse.server import ServerProcess

HEADROOM = 64  # context beyond prompt + answer, so a prompt at the 2% upper edge still fits


def server_ctx(n_ctx: int, n_predict: int) -> int:
    return n_ctx + n_predict + HEADROOM


def make_samples(ctx: GateContext, model: str, n_ctx: int, n_predict: int) -> list[niah.NiahSample]:
    return make_sample_sets(ctx, model, n_ctx, n_predict, 0)[0]


def make_sample_sets(ctx: GateContext, model: str, n_ctx: int, n_predict: int,
                     n_calibration: int) -> tuple[list[niah.NiahSample], list[niah.NiahSample]]:
    """The scored samples and `n_calibration` unscored ones per task (their own stream of keys,
    values and depths), both written under samples/."""
    spec = ctx.spec
    arm = spec.reference
    cfg = ctx.server_config(arm, model, server_ctx(n_ctx, n_predict), spec.cache_types[0])
    ctx.progress.log(f"  generating {spec.samples} x {len(spec.tasks)} needles at {n_ctx} tokens for {model}"
                     + (f" (and {n_calibration} to calibrate on)" if n_calibration else ""))
    with ServerProcess(cfg, ctx.log_path("tokenize", model, n_ctx)) as server:
        def count(text: str) -> int:
            return len(server.tokenize(text, add_special=True))

        samples = [s for task in spec.tasks for s in niah.generate(task, n_ctx, spec.samples, spec.seed, count)
                   if not spec.only_samples or s.index in spec.only_samples]
        calibration = [s for task in spec.tasks if n_calibration
                       for s in niah.generate(task, n_ctx, n_calibration, spec.seed, count, calibration=True)]
    path = ctx.out_dir / "samples" / f"{model}-{n_ctx}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(s) for s in samples], indent=1))
    if calibration:
        path.with_name(f"{model}-{n_ctx}-calibration.json").write_text(
            json.dumps([asdict(s) for s in calibration], indent=1))
    return samples, calibration


LEADING_NON_WORD = re.compile(r"^[^0-9A-Za-z]+")
N_PROBS = 2  # each answer token and its runner-up: what the decisive margin is read from


def decisive_margin(resp: dict, values: tuple[str, ...] | list[str]) -> float | None:
    """How close a greedy answer came to another value: the smallest gap, in nats, between a
    generated token's log-probability and its runner-up's, over the tokens that spell the answer's
    value (those with a letter or digit, until the output, from its first letter or digit, is as
    long as the longest expected value). Punctuation and blanks (a quote or none before the
    number, often chosen from the prompt's own logits) are left out: they never change the value.
    A needle found by a gap of 0.1 can flip under any change to the attention output (a cache
    type, a SIMD width), so the report shows it beside the found/lost verdict. None when no such
    token has probabilities."""
    steps = resp.get("completion_probabilities") or []
    want = max((len(v) for v in values), default=0)
    text, gaps = "", []
    for step in steps:
        top = step.get("top_logprobs") or []
        token = step.get("token", "")
        if len(top) >= 2 and any(ch.isalnum() for ch in token):
            gaps.append(top[0]["logprob"] - top[1]["logprob"])
        text += token
        if len(LEADING_NON_WORD.sub("", text)) >= want:
            break
    return round(min(gaps), 4) if gaps else None


def sample_record(s: niah.NiahSample, output: str, prompt_evaluated: int | None = None,
                  margin: float | None = None) -> dict:
    """One answer. `prompt_evaluated`: the prompt tokens the server evaluated for it (the timings'
    prompt_n), where the gate reads it (shared prefill: a restored slot re-reads one); `margin`:
    its decisive margin (decisive_margin)."""
    rec = {"task": s.task, "index": s.index, "depth": s.depth, "prompt_tokens": s.prompt_tokens,
           "key": s.key, "expected": list(s.values), "output": output, "score": niah.score(s, output)}
    if prompt_evaluated is not None:
        rec["prompt_evaluated"] = prompt_evaluated
    if margin is not None:
        rec["margin"] = margin
    return rec


def calibrate(server: ServerProcess, arm: Arm, calibration: list[niah.NiahSample], n_predict: int) -> list[dict]:
    """Answer the calibration samples, unscored, each for at least n_predict tokens (the end of
    text ignored) and for an SCSA arm that calibrates at least its whole window. Their records
    are kept for the report. Raises ArmError when SCSA's taus are still not frozen after them
    (the last response's `timings.sparse` says): scored answers would then start exact and
    flatter the arm. A context too short for SCSA to seal a region has nothing to calibrate on:
    it reads every row exactly, and goes on doing so for the scored answers, which is what a user
    gets there; the last record says so. An arm that does not calibrate (dense, the block path,
    SCSA with loaded taus) answers none: no state of its server depends on an earlier answer, and
    at 7K a calibration question costs each such arm a prefill."""
    steps = scsa_calibration_steps(arm)
    if not steps or not calibration:
        return []
    records, sparse = [], {}
    for s in calibration:
        resp = server.complete(s.prompt, n_predict=max(n_predict, steps + 1), ignore_eos=True)
        records.append(sample_record(s, resp.get("content", "")))
        sparse = resp.get("timings", {}).get("sparse") or {}
    if sparse.get("calibrated"):
        return records
    if sparse.get("calibration_steps") == 0 and sparse.get("rows_read") == sparse.get("rows_visible"):
        records[-1]["scsa"] = "nothing sealed to calibrate on at this length: every row read exactly"
        return records
    raise ArmError(f"arm {arm.name}: SCSA's taus are not frozen after the {len(calibration)} calibration "
                   f"sample(s) ({steps} calibration steps expected; the last response's sparse figures: {sparse}); "
                   "the scored answers would start exact\n" + server.log_tail())


def constrained(ctx: GateContext) -> dict:
    """The request's json_schema where the gate gives one (a grammar the sampler applies)."""
    return {"json_schema": ctx.spec.json_schema} if ctx.spec.json_schema is not None else {}


# The requests a gate's `mix` sends, one per sample in turn: greedy; greedy constrained by the
# gate's json_schema; sampled (temperature 0.7, a seed per sample, the same alone and under
# load); sampled on the backend (llama-server's backend_sampling: the recheck never takes such a
# step back). The first two are deterministic: under load each must answer as it does alone and
# be computed again on the steps it is alone.
REQUEST_KINDS = ("greedy", "json", "sampled", "backend")
DETERMINISTIC = ("greedy", "json")
SAMPLING = {"temperature": 0.7, "top_k": 40}


def request_of(ctx: GateContext, s: niah.NiahSample) -> tuple[str, dict]:
    """The request sample `s` sends: its kind and parameters (without a mix: greedy, constrained
    where the gate gives a json_schema)."""
    if not ctx.spec.mix:
        return "greedy", constrained(ctx)
    kind = ctx.spec.mix[s.index % len(ctx.spec.mix)]
    seed = {"seed": ctx.spec.seed + s.index}
    return kind, {"greedy": {}, "json": constrained(ctx), "sampled": {**SAMPLING, **seed},
                  "backend": {**SAMPLING, **seed, "backend_sampling": True}}[kind]


def staggered_n_predict(n_predict: int, index: int) -> int:
    """Tokens asked of sample `index` in a staggered gate: a full, three-quarter, half or quarter
    answer in turn (at least 8 tokens), so concurrent requests end at different times. The same
    for the sample alone and under load, so the two answers compare."""
    return max(8, n_predict * (4 - index % 4) // 4)


def answer(ctx: GateContext, arm: Arm, model: str, n_ctx: int, cache: str, n_predict: int,
           samples: list[niah.NiahSample], batch: int = 1,
           calibration: list[niah.NiahSample] | None = None) -> ArmResult:
    """Every sample answered by one server; with batch B > 1, B requests at a time (--parallel B).
    The calibration samples, if any, are answered first, one at a time, and not scored."""
    result = ArmResult(arm.name, model, n_ctx, cache, batch=batch)
    task = ctx.progress.task(f"niah {arm.name} {model} @{n_ctx} {cache} B{batch}", total=len(samples))
    try:
        cfg = ctx.server_config(arm, model, batch * server_ctx(n_ctx, n_predict), cache, parallel=batch)
        with ServerProcess(cfg, ctx.log_path("niah", arm.name, model, n_ctx, cache, f"B{batch}")) as server:
            if calibration:
                task.update(description=f"niah {arm.name} {model} @{n_ctx} {cache} B{batch}: calibrating")
                result.calibration = calibrate(server, arm, calibration, n_predict)
                task.update(description=f"niah {arm.name} {model} @{n_ctx} {cache} B{batch}")
            stagger = ctx.spec.stagger

            def one(s: niah.NiahSample, delay: float = 0.0) -> dict:
                time.sleep(delay)
                n = staggered_n_predict(n_predict, s.index) if stagger else n_predict
                kind, params = request_of(ctx, s)
                # the runner-up probabilities need the logits on the host: llama-server then samples
                # a backend_sampling request on the CPU, so that request goes without them
                probs = {} if params.get("backend_sampling") else {"n_probs": N_PROBS}
                # a mix compares each request with itself alone: without the prompt cache both
                # evaluate its whole prompt (a prefix cached from the slot's last request starts
                # the evaluation elsewhere, and a row's bits depend on its micro-batch)
                cache = {"cache_prompt": False} if ctx.spec.mix else {}
                resp = server.complete(s.prompt, n_predict=n, **probs, **params, **cache)
                task.advance()
                rec = sample_record(s, resp.get("content", ""), margin=decisive_margin(resp, s.values))
                if ctx.spec.mix:
                    # the response's own figures: steps computed again densely, of the sparse ones
                    rechecked = timings.from_response(resp).sparse_rechecked
                    rec.update(request=kind, decoded=int(resp["timings"]["predicted_n"]),
                               rechecked=list(rechecked) if rechecked else None)
                return rec

            if batch == 1:
                for s in samples:
                    result.samples.append(one(s))
            elif stagger:
                # every request on its own client, sent `stagger` seconds after the one before:
                # they arrive while others decode (the server queues what its slots cannot take)
                # and, with their lengths varied, end at different times
                with ThreadPoolExecutor(len(samples)) as pool:
                    for rec in pool.map(one, samples, [i * stagger for i in range(len(samples))]):
                        result.samples.append(rec)
            else:
                with ThreadPoolExecutor(batch) as pool:
                    for rec in pool.map(one, samples):
                        result.samples.append(rec)
    except ArmError as e:
        return result.fail(f"{e}\n{kept(result, samples)}")
    scored(result)
    return result


SLOT_FILE = "shared-prefill.bin"
MAX_REUSED_TAIL = 16  # tokens an arm may evaluate after restoring the shared slot (the server re-reads the last)


def shared_slot_args(slots: Path) -> list[str]:
    """The server flags of an arm that saves or restores the shared slot in `slots`.
    --swa-full: a sliding-window model (Gemma 3) otherwise keeps only the last window of its SWA
    layers, and the slot restored from the first arm's state (prompt and answer) could not reuse
    the prompt once the answer is cut: llama-server would prefill it again. A full SWA cache
    changes no output (the mask is the same)."""
    slots.mkdir(parents=True, exist_ok=True)
    return ["--slot-save-path", f"{slots}/", "--swa-full"]


def answer_shared(ctx: GateContext, arms: list[Arm], model: str, n_ctx: int, cache: str, n_predict: int,
                  samples: list[niah.NiahSample],
                  calibration: list[niah.NiahSample] | None = None) -> list[ArmResult]:
    """Every sample prefilled once: the first arm prefills it (one token answered) and saves its
    slot, then every arm, the first included, restores that slot and answers the same prompt from
    the restored cache, re-reading only the prompt's last token, alone in its batch (the server
    marks it a prompt's, so every arm reads it densely, as dense does). Prefill is dense in
    every arm, so the cache is the one each arm would have written itself, and every arm reaches
    its answer the same way: what differs between arms is their decode alone. (A reference that
    answered from its own prefill would differ from the restored arms by more than the method: its
    last prompt token is computed inside a prefill batch, theirs alone, and the rounding of the two
    differs; on Gemma 3 at 16K that alone moved needles.) All arms' servers run
    side by side; one that dies is that arm's error, the others go on. The results are in the
    report from the start and it is written after every sample, so a run cut short keeps every
    answer given so far."""
    results = [ArmResult(a.name, model, n_ctx, cache) for a in arms]
    for result in results:
        ctx.record(result)
    slots = ctx.out_dir / "slots"
    slots.mkdir(parents=True, exist_ok=True)
    task = ctx.progress.task(f"niah shared prefill {model} @{n_ctx} {cache} ({len(arms)} arms)", total=len(samples))
    with ExitStack() as stack:
        servers: list[ServerProcess | None] = []
        for arm, result in zip(arms, results):
            try:
                cfg = ctx.server_config(arm, model, server_ctx(n_ctx, n_predict), cache)
                cfg.extra_args += shared_slot_args(slots)
                server = stack.enter_context(ServerProcess(cfg, ctx.log_path("niah", arm.name, model, n_ctx, cache, "shared")))
                if calibration:
                    result.calibration = calibrate(server, arm, calibration, n_predict)
                servers.append(server)
            except ArmError as e:
                result.fail(str(e))
                servers.append(None)
        for s in samples:
            for i, (arm, server, result) in enumerate(zip(arms, servers, results)):
                if server is None or result.error is not None or (i > 0 and results[0].error is not None):
                    continue
                try:
                    if i == 0:
                        server.complete(s.prompt, n_predict=1, id_slot=0)
                        server.request("POST", "/slots/0?action=save", json={"filename": SLOT_FILE})
                    server.request("POST", "/slots/0?action=restore", json={"filename": SLOT_FILE})
                    resp = server.complete(s.prompt, n_predict=n_predict, id_slot=0, n_probs=N_PROBS, **constrained(ctx))
                    evaluated = int(resp.get("timings", {}).get("prompt_n", 0))
                    if evaluated > MAX_REUSED_TAIL:
                        raise ArmError(f"arm {arm.name}: the restored prefill was not reused "
                                        f"({evaluated} prompt tokens evaluated)")
                    result.samples.append(sample_record(s, resp.get("content", ""), evaluated,
                                                        decisive_margin(resp, s.values)))
                except ArmError as e:
                    result.fail(f"{e}\n{kept(result, samples)}")
            task.advance()
            ctx.save()
        (slots / SLOT_FILE).unlink(missing_ok=True)
    if results[0].error is not None:
        for arm, result in zip(arms[1:], results[1:]):
            if result.error is None:
                result.fail(f"arm {arm.name} stopped with the first arm ({arms[0].name}), which prefills every "
                            f"prompt\n{kept(result, samples)}")
    for result in results:
        if result.error is None:
            scored(result)
    return results


def kept(result: ArmResult, samples: list[niah.NiahSample]) -> str:
    return f"({len(result.samples)} of {len(samples)} samples answered before the error; they are kept in samples)"


def scored(result: ArmResult) -> None:
    scores = [x["score"] for x in result.samples]
    result.metrics["niah"] = sum(scores) / len(scores)
    for t in sorted({x["task"] for x in result.samples}):
        sub = [x["score"] for x in result.samples if x["task"] == t]
        result.metrics[f"niah:{t}"] = sum(sub) / len(sub)
    result.metrics["samples"] = float(len(scores))


def count_against_reference(reference: ArmResult, result: ArmResult) -> None:
    """The needles `result` lost and gained against the reference arm, needle by needle (the
    `max_lost` threshold bounds the first, whatever the score)."""
    lost, gained = compare_needles(reference.samples, result.samples)
    result.metrics["lost_vs_reference"] = float(len(lost))
    result.metrics["gained_vs_reference"] = float(len(gained))


def mixed_load_metrics(alone: ArmResult, loaded: ArmResult, reference: ArmResult | None) -> None:
    """A mix under load against the same requests alone: the deterministic answers that changed;
    of those that did not (the same text in as many tokens), the ones computed again on other
    steps; and how many more answers changed than in the reference arm under the same load.
    Upstream's CPU kernels are not batch-invariant (a prompt is cut into other micro-batches under
    load, dense's answers move too), so an answer of other tokens may be computed again elsewhere;
    one that is the same must be computed again where it is alone, or another slot's doubt reached it."""
    pairs = [(a, b) for a, b in zip(alone.samples, loaded.samples) if a.get("request") in DETERMINISTIC]
    same = [(a, b) for a, b in pairs if a["output"] == b["output"] and a.get("decoded") == b.get("decoded")]
    loaded.metrics["deterministic_requests"] = float(len(pairs))
    loaded.metrics["deterministic_changed_under_load"] = float(len(pairs) - len(same))
    loaded.metrics["rechecks_changed_under_load"] = float(sum(a.get("rechecked") != b.get("rechecked") for a, b in same))
    if reference is not None and reference is not loaded:
        loaded.metrics["changed_beyond_reference"] = (loaded.metrics["deterministic_changed_under_load"]
                                                      - reference.metrics["deterministic_changed_under_load"])


def run(ctx: GateContext) -> None:
    spec = ctx.spec
    n_predict = spec.n_predict
    if any(niah.task_spec(t).haystack == "essay" for t in spec.tasks):
        source = niah.prose_source()
        ctx.report.notes.append(f"prose haystack: {source['source']}, Python {source['python']}, "
                                f"{source['sentences']} sentences, sha256 {source['sha256'][:12]}")
    for model in spec.models:
        for n_ctx in spec.context_lengths:
            samples, calibration = make_sample_sets(ctx, model, n_ctx, n_predict, spec.calibration_samples)
            for cache in spec.cache_types:
                reference: ArmResult | None = None
                shared = iter(answer_shared(ctx, list(ctx.arms), model, n_ctx, cache, n_predict, samples,
                                            calibration) if spec.shared_prefill else ())
                reference_load: dict[int, ArmResult] = {}
                for arm in ctx.arms:
                    alone: ArmResult | None = None
                    for batch in spec.batch:
                        r = next(shared) if spec.shared_prefill else \
                            answer(ctx, arm, model, n_ctx, cache, n_predict, samples, batch, calibration)
                        if r.error is None:
                            if batch == 1:
                                alone = r
                                if arm.name == spec.reference.name:
                                    reference = r
                                elif reference is not None:
                                    count_against_reference(reference, r)
                            elif alone is not None:
                                # the bar under load: every needle found alone is found again
                                # (with a mix, of the deterministic requests: a sampled draw near a
                                # boundary can follow a batch's last bits, dense's too)
                                found_alone = {x["index"] for x in alone.samples if x["score"] == 1.0
                                               and (not spec.mix or x.get("request") in DETERMINISTIC)}
                                lost = sorted(x["index"] for x in r.samples
                                              if x["index"] in found_alone and x["score"] < 1.0)
                                same = sum(a["output"] == b["output"] for a, b in zip(alone.samples, r.samples))
                                r.metrics["lost_under_load"] = float(len(lost))
                                r.metrics["same_answer_share"] = same / len(r.samples)
                                if spec.mix:
                                    mixed_load_metrics(alone, r, reference_load.get(batch))
                                    if arm.name == spec.reference.name:
                                        reference_load[batch] = r
                            found = sum(1 for x in r.samples if x["score"] == 1.0)
                            ctx.progress.log(f"  {arm.name} {model} @{n_ctx} {cache} B{batch}: niah "
                                             f"{r.metrics['niah']:.1%} ({found}/{len(r.samples)} found)")
                        if spec.shared_prefill:
                            ctx.save()  # answer_shared recorded it
                        else:
                            ctx.record(r)


NIAH_KEYS = ("tasks", "batch", "calibration_samples", "shared_prefill", "only_samples", "stagger", "json_schema", "mix")
NIAH_THRESHOLDS = {
    "min_score": Threshold("fraction of needles found, per arm and context", "niah", "min", 0, 1),
    "max_lost": Threshold("needles the reference arm found that another arm did not (alone, same "
                          "model, context and cache)", "lost_vs_reference", "max", 0, integer=True),
    # the bar under load, not a setting: every needle found alone is found again
    "max_lost_under_load": Threshold("needles an arm found alone and lost under load (batch > 1)",
                                     "lost_under_load", "max", 0, integer=True, default=0, settable=False),
    # a mix under load, rules of the kind: a request that answers as alone is computed again where
    # it is alone, and requests answer as alone as often as the reference arm's do
    "max_rechecks_changed_under_load": Threshold(
        "deterministic requests (greedy, JSON schema) answering as alone but computed again on other steps",
        "rechecks_changed_under_load", "max", 0, integer=True, default=0, settable=False),
    "max_changed_beyond_reference": Threshold(
        "deterministic answers changed under load, beyond the reference arm's count",
        "changed_beyond_reference", "max", 0, integer=True, default=0, settable=False),
}
KIND = Kind("niah", run, keys=NIAH_KEYS, thresholds=NIAH_THRESHOLDS, n_predict=128)
