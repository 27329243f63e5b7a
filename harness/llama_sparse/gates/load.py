"""load gate: many clients, one server with parallel slots, a bounded number of needle requests.

The seed's fork hit a request parse race under load; this gate is how we show we have nothing
like it. Per arm, one server (`--parallel B`):

1. every needle sample is asked alone, one request at a time (the answers to compare with);
2. then `clients` threads send `requests` requests in all (the samples round-robin), as fast as
   the server answers, until done or until `time_limit` seconds have passed (no request is sent
   after it; the ones in flight finish).

Every response is judged: HTTP status (a 5xx is a failure), a body that parses as JSON with a
string `content` (else a parse error), the needle found or not. Afterwards the server must still
be alive and its log must hold a timing line for every request answered. A needle found alone
and missed under load fails the arm; identical answers are reported as a share, not a bar
(upstream's batched CPU numerics are not batch-invariant). A server that dies is an error of the
arm with its log tail, never a score; what was measured until then is kept.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from llama_sparse import timings
from llama_sparse.errors import ArmError
from llama_sparse.gates import niah
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.needles import make_samples, server_ctx
from llama_sparse.gates.report import ArmResult
from llama_sparse.gates.schema import Arm, Kind, Threshold
from llama_sparse.server import ServerProcess

TIMING_WAIT_S = 10.0   # the timing lines are written just after a response is sent


def _request_body(server: ServerProcess, prompt: str, n_predict: int) -> dict:
    return {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
            "cache_prompt": True, "seed": server.config.seed}


def load_arm(ctx: GateContext, arm: Arm, model: str, n_ctx: int, cache: str, n_predict: int,
             samples: list[niah.NiahSample]) -> ArmResult:
    spec = ctx.spec
    parallel = spec.batch[0]
    result = ArmResult(arm.name, model, n_ctx, cache, batch=parallel)
    m = result.metrics
    alone: dict[int, dict] = {}
    records: list[dict] = []
    lock = threading.Lock()
    task = ctx.progress.task(f"load {arm.name} {model} @{n_ctx} {cache} np{parallel}",
                             total=len(samples) + spec.requests)
    cfg = ctx.server_config(arm, model, parallel * server_ctx(n_ctx, n_predict), cache, parallel=parallel)
    log = ctx.log_path("load", arm.name, model, n_ctx, cache, f"np{parallel}")
    server = ServerProcess(cfg, log)
    try:
        server.start()
        for s in samples:
            out = server.complete(s.prompt, n_predict=n_predict).get("content", "")
            alone[s.index] = {"output": out, "found": niah.score(s, out) == 1.0}
            task.advance()

        offset = server.log_size()
        deadline = time.monotonic() + spec.time_limit
        next_request = iter(range(spec.requests))

        def client() -> None:
            while True:
                with lock:
                    i = next(next_request, None)
                if i is None or time.monotonic() > deadline:
                    return
                s = samples[i % len(samples)]
                t0 = time.monotonic()
                status, text = server.post_raw("/completion", _request_body(server, s.prompt, n_predict))
                rec = {"request": i, "sample": s.index, "status": status, "seconds": time.monotonic() - t0}
                try:
                    content = json.loads(text).get("content") if status == 200 else None
                    if status == 200 and not isinstance(content, str):
                        raise ValueError("no string 'content'")
                    rec["parsed"] = True
                except (ValueError, AttributeError) as e:
                    rec["parsed"], rec["parse_error"], content = False, f"{e}: {text[:200]!r}", None
                if content is not None:
                    rec["output"] = content
                    rec["found"] = niah.score(s, content) == 1.0
                with lock:
                    records.append(rec)
                task.advance()

        started = time.monotonic()
        with ThreadPoolExecutor(spec.clients) as pool:
            futures = [pool.submit(client) for _ in range(spec.clients)]
            for f in futures:
                f.result()   # a dead server raises ServerError here
        elapsed = time.monotonic() - started

        answered = sum(1 for r in records if r["status"] == 200)
        # every answered request's timing lines, once they reached the log (counted, not required:
        # a missing one is what the gate reports)
        timing_lines = len(timings.parse(server.read_log(offset)))
        if timing_lines < answered:
            server.wait_log_until(lambda text: True if len(timings.parse(text)) >= answered else None, offset,
                                  timeout=TIMING_WAIT_S, required=False)
            timing_lines = len(timings.parse(server.read_log(offset)))
        alive = server.alive()
    except ArmError as e:
        result.samples = sorted(records, key=lambda r: r["request"])
        died = server.proc is not None and server.proc.poll() is not None
        what = "the server died under load" if died and records else "the server failed"
        return result.fail(f"{what}: {e}\n({len(records)} requests answered before the error; kept in samples)")
    finally:
        server.stop()

    lost = sorted({r["sample"] for r in records if alone[r["sample"]]["found"] and r.get("found") is False})
    answered_records = [r for r in records if "output" in r]
    same = sum(1 for r in answered_records if r["output"] == alone[r["sample"]]["output"])
    m["requests"] = float(len(records))
    m["not_sent"] = float(spec.requests - len(records))
    m["http_5xx"] = float(sum(1 for r in records if r["status"] >= 500))
    m["http_other_errors"] = float(sum(1 for r in records if r["status"] != 200 and r["status"] < 500))
    m["parse_errors"] = float(sum(1 for r in records if not r["parsed"]))
    m["timing_lines_missing"] = float(max(0, answered - timing_lines))
    m["found_alone"] = float(sum(1 for a in alone.values() if a["found"]))
    m["lost_under_load"] = float(len(lost))
    m["same_answer_share"] = same / len(answered_records) if answered_records else float("nan")
    m["requests_per_s"] = len(records) / elapsed if elapsed > 0 else float("nan")
    m["seconds"] = elapsed
    result.samples = [{"alone": {str(k): v for k, v in alone.items()}}] + sorted(records, key=lambda r: r["request"])
    if not alive:
        return result.fail("the server exited after the load phase\n" + server.log_tail())
    ctx.progress.log(f"  {arm.name} {model} @{n_ctx} {cache} np{parallel}: {len(records)} requests in {elapsed:.0f} s, "
                     f"5xx {m['http_5xx']:.0f}, parse errors {m['parse_errors']:.0f}, timing lines missing "
                     f"{m['timing_lines_missing']:.0f}, needles lost {len(lost)}, same answers {m['same_answer_share']:.1%}")
    return result


def run(ctx: GateContext) -> None:
    spec = ctx.spec
    for model in spec.models:
        for n_ctx in spec.context_lengths:
            samples = make_samples(ctx, model, n_ctx, spec.n_predict)
            for cache in spec.cache_types:
                for arm in ctx.arms:
                    ctx.record(load_arm(ctx, arm, model, n_ctx, cache, spec.n_predict, samples))


def _none_of(what: str, metric: str) -> Threshold:
    return Threshold(f"{what}: none allowed", metric, "max", 0, integer=True, default=0, settable=False)


# load passes only with no 5xx, no other HTTP error, no parse error, a timing line per request,
# every request sent and no needle lost: rules of the kind, nothing a gate file tunes
KIND = Kind(
    "load", run,
    keys=("tasks", "batch", "clients", "requests", "time_limit"),
    thresholds={
        "max_http_5xx": _none_of("responses with a 5xx status", "http_5xx"),
        "max_http_other_errors": _none_of("responses with another status than 200", "http_other_errors"),
        "max_parse_errors": _none_of("bodies that are not JSON with a string content", "parse_errors"),
        "max_timing_lines_missing": _none_of("answered requests without a timing line", "timing_lines_missing"),
        "max_lost_under_load": _none_of("needles found alone and lost under load", "lost_under_load"),
        "max_not_sent": _none_of("requests not sent within the time limit", "not_sent"),
    })

