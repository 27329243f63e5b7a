"""A request's timings: from its /completion response, or from llama-server's log.

The response's `timings` object is what gates read; with sparse attention it carries a `sparse`
object (the block method's read fraction and steps computed again, SCSA's rows read and its
calibration). The log's per-request block is kept for people and for log-only tools (from a real
run, see tests/data/):

    0.15.657.752 I slot print_timing: id  0 | task 0 | prompt eval time =    8448.04 ms /  1024 tokens (    8.25 ms per token,   121.21 tokens per second)
    0.15.657.758 I slot print_timing: id  0 | task 0 |        eval time =    3643.52 ms /    32 tokens (  117.53 ms per token,     8.51 tokens per second)
    0.15.657.759 I slot print_timing: id  0 | task 0 |       total time =   12091.56 ms /  1056 tokens
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_NUM = r"([0-9]+(?:\.[0-9]+)?|nan|inf)"
_SLOT = re.compile(r"print_timing: id\s+(\d+) \| task (\d+)")
_EVAL = re.compile(
    rf"(prompt eval|eval) time =\s+{_NUM} ms /\s+(\d+) (?:tokens|runs)\s+\(\s*{_NUM} ms per token,\s+{_NUM} tokens per second\)")
_TOTAL = re.compile(rf"total time =\s+{_NUM} ms /\s+(\d+) tokens")
_SPARSE = re.compile(rf"sparse attention: decode read\s+{_NUM}% of the visible KV blocks \((\d+) of (\d+) block reads\)"
                     r"(?:; (\d+) of (\d+) steps computed again densely)?")
# SCSA's line for a request: the rows read exactly (opened clusters and exact rows) out of the
# rows visible to its calls, then its counters for the request (attention calls, clusters scored,
# plans rebuilt, calls computed exactly) and where its calibration stands (the counters optional
# here, as parse reads the rows alone; a reader that needs them checks they matched). The one
# definition of the line: tests read its fields by these names.
SCSA_LINE = re.compile(rf"scsa: decode read\s+{_NUM}% of the visible rows "
                       r"\(opened (?P<opened>\d+), exact (?P<exact>\d+), of (?P<visible>\d+)\)"
                       r"(?:; calls (?P<calls>\d+), clusters scored (?P<scored>\d+), rebuilds (?P<rebuilds>\d+), "
                       r"exact calls (?P<exact_calls>\d+); calibration (?P<calibration_steps>\d+) steps, "
                       r"(?P<state>taus frozen|calibrating)"
                       r"(?:; audited (?P<audited>\d+) steps, (?P<lowered>\d+) taus lowered)?)?")


@dataclass(frozen=True)
class EvalTiming:
    tokens: int
    ms: float
    ms_per_token: float
    tokens_per_second: float


@dataclass(frozen=True)
class RequestTiming:
    slot: int | None
    task: int | None
    prompt: EvalTiming | None
    decode: EvalTiming | None
    total_ms: float | None = None
    sparse_read_fraction: float | None = None   # block-sparse: KV blocks read / visible, decode steps
    sparse_blocks_visible: int | None = None    # block-sparse: visible block reads of the decode rows
    sparse_rechecked: tuple[int, int] | None = None  # block-sparse: (steps computed again densely, sparse steps)
    prefill_read_fraction: float | None = None  # block-sparse prefill: KV blocks the prompt's rows read / visible


def from_response(resp: dict[str, Any]) -> RequestTiming:
    """The timings of one /completion response. The block method's figures are None where its
    decode read nothing sparsely (below --sparse-attn-min-kv), as the log then prints no line."""
    t = resp["timings"]
    prompt = EvalTiming(tokens=int(t["prompt_n"]), ms=float(t["prompt_ms"]),
                        ms_per_token=float(t["prompt_per_token_ms"]), tokens_per_second=float(t["prompt_per_second"]))
    decode = EvalTiming(tokens=int(t["predicted_n"]), ms=float(t["predicted_ms"]),
                        ms_per_token=float(t["predicted_per_token_ms"]), tokens_per_second=float(t["predicted_per_second"]))
    rec = RequestTiming(slot=resp.get("id_slot"), task=None, prompt=prompt, decode=decode, total_ms=prompt.ms + decode.ms)
    sp = t.get("sparse")
    if not sp:
        return rec
    if sp["method"] == "scsa":
        if sp["rows_visible"] > 0:
            rec = dataclasses.replace(rec, sparse_read_fraction=sp["rows_read"] / sp["rows_visible"])
        if sp.get("steps_rechecked", 0) > 0:
            # SCSA counts no sparse steps: the request's decode steps are the denominator
            rec = dataclasses.replace(rec, sparse_rechecked=(int(sp["steps_rechecked"]), decode.tokens))
        return rec
    if sp.get("prefill_blocks_visible", 0) > 0:
        rec = dataclasses.replace(rec, prefill_read_fraction=sp["prefill_blocks_read"] / sp["prefill_blocks_visible"])
    if sp["blocks_visible"] > 0:
        rec = dataclasses.replace(rec, sparse_read_fraction=sp["blocks_read"] / sp["blocks_visible"],
                                  sparse_blocks_visible=int(sp["blocks_visible"]),
                                  sparse_rechecked=(int(sp["steps_rechecked"]), int(sp["steps_sparse"])))
    return rec


def parse(text: str) -> list[RequestTiming]:
    """Every request's timings, in log order. A request is closed by its `total time` line.

    Lines of concurrent slots may interleave; each line carries its slot and task, so the
    records are kept apart by (slot, task).
    """
    out: list[RequestTiming] = []
    open_: dict[tuple[int | None, int | None], dict[str, EvalTiming]] = {}
    for line in text.splitlines():
        m = _SLOT.search(line)
        key = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        e = _EVAL.search(line)
        if e:
            rec = EvalTiming(tokens=int(e.group(3)), ms=float(e.group(2)),
                             ms_per_token=float(e.group(4)), tokens_per_second=float(e.group(5)))
            open_.setdefault(key, {})["prompt" if e.group(1) == "prompt eval" else "decode"] = rec
            continue
        t = _TOTAL.search(line)
        if t and key in open_:
            parts = open_.pop(key)
            out.append(RequestTiming(key[0], key[1], parts.get("prompt"), parts.get("decode"), float(t.group(1))))
            continue
        sp = _SPARSE.search(line)
        if sp and out and (out[-1].slot, out[-1].task) == key:
            # printed after the request's total line
            read, visible = int(sp.group(2)), int(sp.group(3))
            rechecked = (int(sp.group(4)), int(sp.group(5))) if sp.group(4) else None
            out[-1] = dataclasses.replace(out[-1], sparse_read_fraction=read / visible,
                                          sparse_blocks_visible=visible, sparse_rechecked=rechecked)
            continue
        sc = SCSA_LINE.search(line)
        if sc and out and (out[-1].slot, out[-1].task) == key:
            read, visible = int(sc["opened"]) + int(sc["exact"]), int(sc["visible"])
            if visible > 0:
                out[-1] = dataclasses.replace(out[-1], sparse_read_fraction=read / visible)
    return out


def parse_file(path: Path, offset: int = 0) -> list[RequestTiming]:
    """Timings in the log from byte `offset` on (pass the size before a request to get its own)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return parse(f.read().decode("utf-8", errors="replace"))
