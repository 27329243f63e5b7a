"""`llama-sparse estimate`: the decode speed-up to expect on one's own model, from its GGUF header
and per-step costs measured on this project's machines.

A decode step costs three things that scale differently with the model and the context:

- the weights, read once a step: their bytes over the machine's read rate, and a fixed cost per
  layer (`t0` of an A/B report, the dense step at almost no depth, measures both);
- attention, per layer over every key it reads: a fixed amount of work per key row of a KV head
  (reading and converting it, its mask) and, per query head, a dot product over the key's values
  and an add of the value's: `keys * (a0 * n_head_kv + a1 * n_head * (head_dim_k + head_dim_v))`,
  with its own a0, a1 per cache type;
- the block method's selection: the key sketch scores every key against every query head,
  `keys * (s0 * n_head_kv + s1 * n_head * head_dim_k)`, whatever the fraction it then reads.

A sliding-window layer attends its window only, densely (the methods keep no block statistics
for it). A step the recheck computes again costs a dense
step more. The costs are fitted by least squares (every cost at least 0) to the dense and
block-method points of A/B reports, of two models with different head sizes so that a key's
fixed work and its per-value work can be told apart, and SCSA's attention as its share of
dense's where it was measured. What it cannot know: how much of a context the tolerance lets the
method skip on the user's text (the estimate reads the ceiling, half of the blocks, unless
told) and a machine other than the one the reports measured.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from llama_sparse.errors import UserError

# llama.cpp's sliding-window layer pattern by architecture: every Nth layer attends the whole
# context (gemma3: five local layers, then a global one)
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "llama4": 4}

DEFAULT_CEILING = 0.5  # the block method's default with the key sketch: at most half of the blocks

REFERENCE_CACHE = "f16"  # the cache type whose attention costs are fitted term by term


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What a decode step's cost depends on, per model."""

    name: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    weight_bytes: float        # bytes of the weights a decode step reads
    swa_window: int = 0        # 0: every layer attends the whole context
    swa_pattern: int = 0       # every Nth layer is global (0: none is local)

    def layers_at(self, n_ctx: int) -> list[int]:
        """The keys each layer attends at a context of n_ctx."""
        if not self.swa_window or not self.swa_pattern:
            return [n_ctx] * self.n_layer
        return [n_ctx if (il + 1) % self.swa_pattern == 0 else min(n_ctx, self.swa_window)
                for il in range(self.n_layer)]


def shape_from_gguf(path: Path) -> ModelShape:
    """A model's shape from its GGUF header and tensor table (no tensor data is read)."""
    import gguf

    if not path.is_file():
        raise UserError(f"estimate: {path}: no such file")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError and others on a file that is not one
        raise UserError(f"estimate: {path} is not a GGUF file the gguf package can read ({e})") from None

    def field(key: str, default=None):
        f = reader.fields.get(key)
        if f is None:
            return default
        v = f.contents()
        return v

    arch = field("general.architecture")
    if not arch:
        raise UserError(f"estimate: {path} has no general.architecture")
    n_layer = field(f"{arch}.block_count")
    n_head = field(f"{arch}.attention.head_count")
    n_embd = field(f"{arch}.embedding_length")
    if n_layer is None or n_head is None or n_embd is None:
        raise UserError(f"estimate: {path} ({arch}) lacks block_count, attention.head_count or embedding_length")
    n_head_kv = field(f"{arch}.attention.head_count_kv", n_head)
    # per-layer head counts (an array) are taken at their largest: the estimate is per layer alike
    n_head = int(max(n_head)) if isinstance(n_head, list) else int(n_head)
    n_head_kv = int(max(n_head_kv)) if isinstance(n_head_kv, list) else int(n_head_kv)
    dk = int(field(f"{arch}.attention.key_length", n_embd // n_head))
    dv = int(field(f"{arch}.attention.value_length", dk))
    names = {t.name for t in reader.tensors}
    weights = sum(int(t.n_bytes) for t in reader.tensors)
    if "output.weight" in names:
        # a step reads one row of the token embeddings; with tied embeddings the output reads all
        weights -= sum(int(t.n_bytes) for t in reader.tensors if t.name == "token_embd.weight")
    window = int(field(f"{arch}.attention.sliding_window", 0) or 0)
    return ModelShape(name=path.name, n_layer=int(n_layer), n_head=n_head, n_head_kv=n_head_kv,
                      head_dim_k=dk, head_dim_v=dv, weight_bytes=float(weights),
                      swa_window=window if arch in SWA_PATTERN else 0,
                      swa_pattern=SWA_PATTERN.get(arch, 0) if window else 0)


# Public models' shapes (their config.json) and the bytes of their Q4_K_M weights a step reads
# (the GGUF's tensors less the token embeddings where the output has its own), for the docs' table
PRESETS = {
    "Llama-3.1-8B": ModelShape("Llama-3.1-8B Q4_K_M", 32, 32, 8, 128, 128, 4.63e9),
    "Qwen2.5-7B": ModelShape("Qwen2.5-7B Q4_K_M", 28, 28, 4, 128, 128, 4.36e9),
    "Gemma-3-12B": ModelShape("Gemma-3-12B Q4_K_M", 48, 16, 8, 256, 256, 7.30e9, swa_window=1024, swa_pattern=6),
}


@dataclasses.dataclass(frozen=True)
class Costs:
    """Per-step costs on one machine, in seconds: each a pair (per unit, per unit and head element)."""

    machine: str
    per_weight_byte: float
    per_layer: float
    dense: dict[str, tuple[float, float]]    # cache type -> per key x KV head, per key x query head x (dk + dv)
    reads: dict[str, tuple[float, float]]    # the same, for the keys the block method reads
    select: tuple[float, float]              # per key x KV head, per key x query head x dk: the sketch
    rechecked_fraction: float                # steps computed again densely, as measured
    scsa_share: dict[str, float]             # cache type -> SCSA's attention time as a share of dense's
    source: str
    scsa_rechecked_fraction: float = 0.0     # SCSA's steps computed again densely, as measured


@dataclasses.dataclass(frozen=True)
class Units:
    """What one step's attention and selection are made of, summed over layers."""

    key_heads: float      # keys attended x KV heads: the work a key row costs once (read, convert, mask)
    att_elems: float      # keys attended x query heads x (dk + dv): a dot product and an add per query head
    sel_elems: float      # keys attended x query heads x dk: the sketch's score per query head

    def attention(self, c: tuple[float, float], fraction: float = 1.0) -> float:
        return fraction * (c[0] * self.key_heads + c[1] * self.att_elems)

    def selection(self, c: tuple[float, float]) -> float:
        return c[0] * self.key_heads + c[1] * self.sel_elems


def units(shape: ModelShape, n_ctx: int, layers: str = "all") -> Units:
    """layers: "all", "global" (those attending the whole context, which the sparse methods
    read) or "local" (sliding-window layers, which keep no block statistics and stay dense)."""
    at = shape.layers_at(n_ctx)
    global_ = [not shape.swa_window or not shape.swa_pattern or (il + 1) % shape.swa_pattern == 0 for il in range(len(at))]
    keys = sum(n for n, g in zip(at, global_) if layers == "all" or (layers == "global") == g)
    qh = float(keys * shape.n_head)
    return Units(float(keys * shape.n_head_kv), qh * (shape.head_dim_k + shape.head_dim_v), qh * shape.head_dim_k)


@dataclasses.dataclass(frozen=True)
class Estimate:
    model: str
    n_ctx: int
    cache_type: str
    dense_ms: float
    block_ms: float
    scsa_ms: float | None

    @property
    def block_speedup(self) -> float:
        return self.dense_ms / self.block_ms

    @property
    def scsa_speedup(self) -> float | None:
        return self.dense_ms / self.scsa_ms if self.scsa_ms else None


def weights_time(costs: Costs, shape: ModelShape) -> float:
    return costs.per_weight_byte * shape.weight_bytes + costs.per_layer * shape.n_layer


def estimate(costs: Costs, shape: ModelShape, n_ctx: int, cache_type: str = "f16",
             read_fraction: float = DEFAULT_CEILING, min_kv: int = 4096) -> Estimate:
    """A decode step at a context of n_ctx, dense and with each method; below min_kv (the
    sequence's minimum, --sparse-attn-min-kv) both methods decode densely."""
    if cache_type not in costs.dense or cache_type not in costs.reads:
        have = sorted(set(costs.dense) & set(costs.reads))
        raise UserError(f"estimate: no measured costs for a {cache_type} KV cache (the calibration has {', '.join(have)})")
    if not 0.0 < read_fraction <= 1.0:
        raise UserError(f"estimate: a read fraction of {read_fraction} is not in (0, 1]")
    t_w = weights_time(costs, shape)
    dense = t_w + units(shape, n_ctx).attention(costs.dense[cache_type])
    block = scsa = dense
    if n_ctx >= min_kv:
        g, local = units(shape, n_ctx, "global"), units(shape, n_ctx, "local")
        t_local = t_w + local.attention(costs.dense[cache_type])
        block = (t_local + g.attention(costs.reads[cache_type], read_fraction) + g.selection(costs.select)
                 + costs.rechecked_fraction * dense)
        share = costs.scsa_share.get(cache_type)
        scsa = (t_local + share * g.attention(costs.dense[cache_type]) + costs.scsa_rechecked_fraction * dense
                if share is not None else None)
    return Estimate(shape.name, n_ctx, cache_type, dense * 1e3, block * 1e3,
                    scsa * 1e3 if scsa is not None else None)


# ---------------------------------------------------------------------------------------------
# calibration from A/B reports

@dataclasses.dataclass(frozen=True)
class Point:
    """One measured decode: an arm at a context and cache type, its step time and what it read."""

    arm: str
    method: str              # "dense", "block" (the key sketch's defaults) or "scsa"
    min_kv: int              # the arm's --sparse-attn-min-kv
    n_ctx: int
    cache_type: str
    ms: float
    read_fraction: float | None
    rechecked_fraction: float | None
    t0_ms: float | None


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags and flags.index(name) + 1 < len(flags) else None


def arm_method(flags: list[str]) -> str | None:
    """What an arm's flags run: dense, the block method with the key sketch's defaults (the
    recheck may be off), SCSA with its defaults (the recheck may be off); None for anything else
    (the bounds, another budget, SCSA without its audits)."""
    mode = _flag(flags, "--sparse-attn")
    if mode is None or mode == "off":
        return "dense"
    if mode == "scsa":
        return None if any(f.startswith("--scsa-") and f != "--scsa-taus" for f in flags) else "scsa"
    tuned = {"--sparse-attn-score", "--sparse-attn-coverage", "--sparse-attn-topk", "--sparse-attn-tolerance",
             "--sparse-attn-block-size", "--sparse-attn-sink", "--sparse-attn-recent"}
    return "block" if mode in ("on", "auto") and not tuned & set(flags) else None


@dataclasses.dataclass(frozen=True)
class Report:
    model: str
    machine: str
    points: list[Point]
    path: Path


def read_report(path: Path) -> Report:
    """The points of an ab report's JSON (llama-sparse gate, kind ab), one step per point."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"estimate: cannot read the report {path}: {e}") from None
    if data.get("kind") != "ab":
        raise UserError(f"estimate: {path} is a {data.get('kind')!r} report; the costs come from an ab report")
    flags = {a["name"]: a.get("flags", []) for a in data["spec"]["arms"]}
    models = {r["model"] for r in data["results"]}
    if len(models) != 1:
        raise UserError(f"estimate: {path} measured {len(models)} models; give one model's reports")
    points = []
    for r in data["results"]:
        m = r.get("metrics") or {}
        method = arm_method(flags.get(r["arm"], []))
        if r.get("error") or "decode_tps_median" not in m or r.get("batch", 1) != 1 or method is None:
            continue
        min_kv = _flag(flags[r["arm"]], "--sparse-attn-min-kv")
        points.append(Point(r["arm"], method, int(min_kv) if min_kv is not None else 4096, int(r["context"]),
                            r["cache_type"], 1000.0 / m["decode_tps_median"], m.get("read_fraction"),
                            m.get("rechecked_fraction"), m.get("t0_ms")))
    machine = data.get("machine") or {}
    label = f"{machine.get('cpu', '?')}, {machine.get('cores_usable') or machine.get('cores', '?')} cores"
    return Report(models.pop(), label, points, path)


def _nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every cost at least 0: a cost the points would make negative (they
    cannot tell it from the others) is 0 and the rest are fitted again."""
    free = list(range(a.shape[1]))
    while True:
        sol = np.zeros(a.shape[1])
        sol[free], *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
        negative = [i for i in free if sol[i] < 0]
        if not negative:
            return sol
        free = [i for i in free if i not in negative]


def fit(reports: list[Report], shapes: dict[str, ModelShape]) -> Costs:
    """Least-squares costs from reports on one machine: each model's t0 (its weights), dense's
    points, the block method's where it read sparsely, SCSA's where it ran past its minimum."""
    machines = {r.machine for r in reports}
    if len(machines) != 1:
        raise UserError(f"estimate: calibrate on reports from one machine (got {'; '.join(sorted(machines))})")
    for r in reports:
        if r.model not in shapes:
            raise UserError(f"estimate: {r.path.name} measured {r.model}, whose shape is not known here")
    pts = [(shapes[r.model], p) for r in reports for p in r.points]
    # the weights: each model's t0, over its weight bytes and layers
    t0: dict[str, list[float]] = {}
    for r in reports:
        t0.setdefault(r.model, []).extend(p.t0_ms / 1e3 for p in r.points if p.t0_ms)
    if not any(t0.values()):
        raise UserError("estimate: no report has t0 (dense at almost no depth, measured beside an arm with a coverage)")
    t0_of = {m: float(np.median(v)) for m, v in t0.items() if v}
    w = _nonnegative_lstsq(np.array([[shapes[m].weight_bytes, shapes[m].n_layer] for m in t0_of]),
                           np.array(list(t0_of.values())))
    per_weight_byte, per_layer = float(w[0]), float(w[1])
    t_w = lambda shape: per_weight_byte * shape.weight_bytes + per_layer * shape.n_layer  # noqa: E731

    # dense attention: both terms from f16's points (the reports measure it on two head sizes);
    # another cache type as a multiple of f16's (they measure it on one model)
    dense_pts: dict[str, list[tuple[Units, float]]] = {}
    for sh, p in pts:
        if p.method == "dense":
            dense_pts.setdefault(p.cache_type, []).append((units(sh, p.n_ctx), p.ms / 1e3 - t_w(sh)))
    if REFERENCE_CACHE not in dense_pts:
        raise UserError(f"estimate: the reports have no dense {REFERENCE_CACHE} points to fit attention on")
    ref = _nonnegative_lstsq(np.array([[u.key_heads, u.att_elems] for u, _ in dense_pts[REFERENCE_CACHE]]),
                             np.array([t for _, t in dense_pts[REFERENCE_CACHE]]))
    dense = {REFERENCE_CACHE: (float(ref[0]), float(ref[1]))}
    for cache, v in dense_pts.items():
        if cache != REFERENCE_CACHE:
            x = np.array([u.attention(dense[REFERENCE_CACHE]) for u, _ in v])
            scale = float(np.dot(x, [t for _, t in v]) / np.dot(x, x))
            dense[cache] = (scale * dense[REFERENCE_CACHE][0], scale * dense[REFERENCE_CACHE][1])

    def sparse(p: Point) -> bool:
        return p.n_ctx >= p.min_kv and p.cache_type in dense

    block = [(sh, p) for sh, p in pts if p.method == "block" and p.read_fraction is not None and sparse(p)]
    if not block:
        raise UserError("estimate: no point of the block method reading sparsely beside dense ones")
    # unknowns: the blocks read as a share of dense's cost for the same keys, and the selection's
    # two terms (the sketch is one format whatever the cache type)
    rows, rhs = [], []
    for sh, p in block:
        u, local = units(sh, p.n_ctx, "global"), units(sh, p.n_ctx, "local")
        dense_step = t_w(sh) + units(sh, p.n_ctx).attention(dense[p.cache_type])
        rows.append([u.attention(dense[p.cache_type], p.read_fraction), u.key_heads, u.sel_elems])
        rhs.append(p.ms / 1e3 - t_w(sh) - local.attention(dense[p.cache_type]) - (p.rechecked_fraction or 0.0) * dense_step)
    read_share, s0, s1 = (float(x) for x in _nonnegative_lstsq(np.array(rows), np.array(rhs)))
    # SCSA's share of dense's attention, from the models whose every layer attends the whole context
    # (where one exists): on a sliding-window model its few global layers say little of a 7B's
    scsa_pts = [(sh, p) for sh, p in pts if p.method == "scsa" and sparse(p)]
    if any(not sh.swa_window for sh, _ in scsa_pts):
        scsa_pts = [(sh, p) for sh, p in scsa_pts if not sh.swa_window]
    scsa_share: dict[str, list[float]] = {}
    for sh, p in scsa_pts:
        # a step its recheck computed again costs a dense step, as the block method's does
        dense_step = t_w(sh) + units(sh, p.n_ctx).attention(dense[p.cache_type])
        spent = (p.ms / 1e3 - t_w(sh) - units(sh, p.n_ctx, "local").attention(dense[p.cache_type])
                 - (p.rechecked_fraction or 0.0) * dense_step)
        scsa_share.setdefault(p.cache_type, []).append(max(0.0, spent / units(sh, p.n_ctx, "global").attention(dense[p.cache_type])))
    return Costs(machine=machines.pop(), per_weight_byte=per_weight_byte, per_layer=per_layer, dense=dense,
                 reads={c: (read_share * a0, read_share * a1) for c, (a0, a1) in dense.items()},
                 select=(s0, s1),
                 rechecked_fraction=float(np.median([p.rechecked_fraction or 0.0 for _, p in block])),
                 scsa_share={c: float(np.median(v)) for c, v in scsa_share.items()},
                 source=", ".join(r.path.name for r in reports),
                 scsa_rechecked_fraction=float(np.median([p.rechecked_fraction or 0.0 for _, p in scsa_pts])) if scsa_pts else 0.0)


def format_table(rows: list[Estimate]) -> str:
    out = ["| model | context | KV cache | dense tok/s | `on` tok/s | `on` vs dense | `scsa` vs dense |",
           "| --- | --: | --- | --: | --: | --: | --: |"]
    for e in rows:
        scsa = f"{e.scsa_speedup:.2f}x" if e.scsa_speedup else "-"
        out.append(f"| {e.model} | {_k(e.n_ctx)} | {e.cache_type} | {1000 / e.dense_ms:.1f} | "
                   f"{1000 / e.block_ms:.1f} | {e.block_speedup:.2f}x | {scsa} |")
    return "\n".join(out)


def _k(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def error_table(costs: Costs, shape: ModelShape, points: list[Point], fit_limit: int | None = None) -> tuple[str, float]:
    """Each measured point beside its estimate (at the read and recheck fractions it measured);
    the largest error, as a fraction. With fit_limit, the points past it (left out of the fit)
    are marked."""
    out = ["| arm | context | KV cache | measured ms/token | estimated | error |", "| --- | --: | --- | --: | --: | --: |"]
    worst = 0.0
    for p in points:
        if p.cache_type not in costs.dense or (p.method == "block" and p.read_fraction is None):
            continue
        c = dataclasses.replace(costs, rechecked_fraction=p.rechecked_fraction or 0.0,
                                scsa_rechecked_fraction=p.rechecked_fraction or 0.0)
        e = estimate(c, shape, p.n_ctx, p.cache_type, p.read_fraction or DEFAULT_CEILING, p.min_kv)
        est = {"dense": e.dense_ms, "block": e.block_ms, "scsa": e.scsa_ms}[p.method]
        if est is None:
            continue
        err = est / p.ms - 1.0
        worst = max(worst, abs(err))
        held_out = " (not fitted)" if fit_limit is not None and p.n_ctx > fit_limit else ""
        out.append(f"| {p.arm} | {_k(p.n_ctx)}{held_out} | {p.cache_type} | {p.ms:.1f} | {est:.1f} | {err:+.0%} |")
    return "\n".join(out), worst


def parse_context(text: str) -> int:
    t = text.strip().lower()
    mult = 1024 if t.endswith("k") else 1
    try:
        n = int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise UserError(f"--context {text!r}: a number of tokens, as 32768 or 32k") from None
    if n <= 0:
        raise UserError(f"--context {text!r} must be positive")
    return n


# The gate models' shapes (their GGUF headers: tests/test_estimate.py reads them again), so that
# a report calibrates without its model file at hand
GATE_MODELS = {
    "smollm2-135m": ModelShape("SmolLM2-135M Q4_1", 30, 9, 3, 64, 64, 96576768.0),
    "gemma3-270m": ModelShape("Gemma-3-270M Q4_K_M", 18, 4, 1, 256, 256, 246587904.0, swa_window=512, swa_pattern=6),
}

# the reports the costs come from by default: the current ones of these gates in docs/results
DEFAULT_CALIBRATION = ("crossover-smollm2", "ab-defaults", "cost-curve-smollm2", "cost-curve-gemma3")


def calibrate(reports: list[Report]) -> Costs:
    return fit(reports, GATE_MODELS)


def describe(costs: Costs) -> str:
    pair = lambda c, unit: f"{c[0] * 1e9:.1f} ns a KV head + {c[1] * 1e12:.2f} ps a query head x {unit}"  # noqa: E731
    per_cache = lambda d, unit: "; ".join(f"{k} {pair(v, unit)}" for k, v in sorted(d.items()))  # noqa: E731
    scsa = ", ".join(f"{c} {v:.0%}" for c, v in sorted(costs.scsa_share.items())) or "not measured"
    return "\n".join([
        f"calibration: {costs.source} ({costs.machine})",
        f"  weights: {1e-9 / costs.per_weight_byte if costs.per_weight_byte else float('inf'):.1f} GB/s "
        f"and {costs.per_layer * 1e3:.3f} ms a layer",
        f"  dense attention, per key: {per_cache(costs.dense, '(dk + dv)')}",
        f"  block method, per key read: {per_cache(costs.reads, '(dk + dv)')}; "
        f"its selection per key {pair(costs.select, 'dk')}; "
        f"{costs.rechecked_fraction:.1%} of its steps computed again",
        f"  SCSA: its attention {scsa} of dense's; {costs.scsa_rechecked_fraction:.1%} of its steps computed again",
    ])
