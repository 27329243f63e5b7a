"""The gate kinds, by name: each module declares its `KIND` (keys, thresholds, run, report)."""

from __future__ import annotations

from llama_sparse.gates import ab, frontier, identity, load, logits, needles, ttft
from llama_sparse.gates.schema import Kind

KINDS: dict[str, Kind] = {m.KIND.name: m.KIND for m in (identity, needles, logits, ab, load, frontier, ttft)}
