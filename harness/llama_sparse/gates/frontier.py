"""frontier gate: needles kept against decode speed, one point per setting, in one run.

Each arm is one setting of a method (a budget, a block size, SCSA's defaults ...); the first arm
is dense. The gate runs the niah part exactly as a niah gate does (the same samples, every arm
answering the same prompts, `shared_prefill` as there) at each of `context_lengths`, then the ab
part at `speed_context` (every arm's decode tokens/s against dense's in the same run, interleaved,
`repeats` rounds of SPEED_N_PREDICT tokens), for each KV cache type. A point is an arm: x its
median speed ratio to dense, y the share of all its needles found, with the needles dense found
and it lost named. Dense sits at (1.0, dense's score). The gate judges nothing (it records where
each setting lands); a server that dies is an error of that arm, never a point.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llama_sparse.gates import ab, needles
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.markdown import tokens_label
from llama_sparse.gates.plot import figure, save_figure
from llama_sparse.gates.report import ArmResult, GateReport, compare_needles
from llama_sparse.gates.schema import Kind

SPEED_N_PREDICT = 64  # tokens per timed round of the speed part (the ab gates' default)


@dataclass
class FrontierPoint:
    model: str
    arm: str
    cache_type: str
    found: int = 0
    total: int = 0
    lost: list[str] = field(default_factory=list)     # needles dense found and this arm did not
    gained: list[str] = field(default_factory=list)   # the reverse
    needle_errors: int = 0                            # needle results of this arm that errored
    ratio: float | None = None                        # median decode speed over dense's, same run
    ratio_min: float | None = None
    ratio_max: float | None = None
    tps: float | None = None
    bound: float | None = None                        # what the arm's declared coverage allows
    read_fraction: float | None = None                # from the server log, block path only
    speed_error: bool = False

    @property
    def score(self) -> float | None:
        return self.found / self.total if self.total else None

    @property
    def complete(self) -> bool:
        """Both coordinates measured, nothing errored: a point that can be drawn."""
        return self.score is not None and self.ratio is not None and not self.needle_errors and not self.speed_error


def is_needle_result(r: ArmResult) -> bool:
    return "niah" in r.metrics or bool(r.samples and "task" in r.samples[0])


def points(report: GateReport) -> list[FrontierPoint]:
    """One point per (model, arm, cache type), in the gate's arm order. Needles are compared with
    the first arm's at the same model, context and cache, needle by needle."""
    spec = report.spec
    speed_context = spec.speed_context
    out: dict[tuple[str, str, str], FrontierPoint] = {}
    for model in spec.models:
        for cache in spec.cache_types:
            for arm in spec.arms:
                out[(model, arm.name, cache)] = FrontierPoint(model, arm.name, cache)
    reference = spec.arms[0].name
    needle_results = [r for r in report.results if is_needle_result(r) and r.batch == 1]
    for r in needle_results:
        p = out.get((r.model, r.arm, r.cache_type))
        if p is None:
            continue
        if r.error is not None:
            p.needle_errors += 1
            continue
        p.found += sum(1 for x in r.samples if x["score"] == 1.0)
        p.total += len(r.samples)
        ref = next((x for x in needle_results if x.arm == reference and x.model == r.model
                    and x.context == r.context and x.cache_type == r.cache_type and x.error is None), None)
        if ref is not None and r.arm != reference:
            lost, gained = compare_needles(ref.samples, r.samples)
            p.lost += [f"{tokens_label(r.context)} {n}" for n in lost]
            p.gained += [f"{tokens_label(r.context)} {n}" for n in gained]
    for r in report.results:
        if is_needle_result(r) or r.context != speed_context:
            continue
        p = out.get((r.model, r.arm, r.cache_type))
        if p is None:
            continue
        if r.error is not None:
            p.speed_error = True
            continue
        m = r.metrics
        p.tps = m.get("decode_tps_median")
        p.ratio, p.ratio_min, p.ratio_max = m.get("ratio_median"), m.get("ratio_min"), m.get("ratio_max")
        p.bound, p.read_fraction = m.get("bound"), m.get("read_fraction")
    return list(out.values())


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(report: GateReport) -> list[str]:
    """The frontier as a table: each setting's needles against dense and its speed."""
    pts = points(report)
    if not pts:
        return []
    spec = report.spec
    contexts = ", ".join(tokens_label(c) for c in spec.context_lengths)
    out = ["", f"## Frontier: needles ({', '.join(spec.tasks)}, {contexts}) against decode speed at "
               f"{tokens_label(spec.speed_context)}", "",
           "| arm | model | cache | needles found | lost against dense | found where dense did not | "
           "decode tok/s | speed vs dense (min-max) | blocks read | bound of that coverage |",
           "|---|---|---|--:|---|---|--:|--:|--:|--:|"]
    for p in pts:
        found = "ERROR" if p.needle_errors else (f"{p.found}/{p.total}" if p.total else "-")
        lost = ", ".join(p.lost) if p.lost else ("-" if p.arm == spec.arms[0].name else "none")
        gained = ", ".join(p.gained) or "-"
        speed = "ERROR" if p.speed_error else (
            f"{p.ratio:.2f}x ({p.ratio_min:.2f}-{p.ratio_max:.2f})" if p.ratio is not None else "-")
        read = _fmt(p.read_fraction * 100 if p.read_fraction is not None else None, ".1f", "%")
        out.append(f"| {p.arm} | {p.model} | {p.cache_type} | {found} | {lost} | {gained} | {_fmt(p.tps, '.1f')} "
                   f"| {speed} | {read} | {_fmt(p.bound, '.2f', 'x')} |")
    return out


def plot(report: GateReport, path: Path) -> Path | None:
    """Needle score against speed ratio, one point per arm, one panel per (model, cache type);
    a point that lost a needle dense found is drawn as a cross with the count beside it."""
    pts = [p for p in points(report) if p.complete]
    if not pts:
        return None
    from matplotlib.ticker import PercentFormatter

    panels: dict[tuple[str, str], list[FrontierPoint]] = {}
    for p in pts:
        panels.setdefault((p.model, p.cache_type), []).append(p)
    fig = figure(len(panels), (6.8, 5.2))
    reference = report.spec.arms[0].name
    for i, ((model, cache), group) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), i + 1)
        dense = next((p for p in group if p.arm == reference), None)
        if dense is not None:
            ax.axhline(dense.score, color="grey", linestyle="--", linewidth=1, label=f"{reference}'s score")
        placed: list[tuple[float, float]] = []   # labels already drawn: (ratio, score)
        for p in sorted(group, key=lambda p: p.ratio):
            lossless = not p.lost
            style = dict(color="black", marker="s") if p.arm == reference else \
                dict(color="tab:green", marker="o") if lossless else dict(color="tab:red", marker="X")
            err = [[max(0.0, p.ratio - p.ratio_min)], [max(0.0, p.ratio_max - p.ratio)]] \
                if p.ratio_min is not None and p.ratio_max is not None else None
            ax.errorbar([p.ratio], [p.score], xerr=err, capsize=3, markersize=8, linestyle="none", **style)
            note = p.arm + ("" if p.arm == reference or lossless else f" (lost {len(p.lost)})")
            # points close together (dense and the settings near it) get their labels stacked,
            # above and below in turn, each stacked label tied to its point by a thin line: it can
            # sit nearer another point than its own
            near = sum(1 for x, y in placed if abs(x - p.ratio) < 0.5 and abs(y - p.score) < 0.02)
            placed.append((p.ratio, p.score))
            above = near % 2 == 0
            rise = 6 + 13 * (near // 2) if above else -16 - 13 * (near // 2)
            leader = dict(arrowstyle="-", color="grey", linewidth=0.6, shrinkA=0, shrinkB=4) if near else None
            ax.annotate(note, (p.ratio, p.score), textcoords="offset points", xytext=(10 if above else -10, rise),
                        ha="left" if above else "right", fontsize="small", arrowprops=leader)
        ys = [p.score for p in group]
        pad = max(0.05, (max(ys) - min(ys)) * 0.3)
        ax.set_ylim(max(0.0, min(ys) - pad), min(1.0, max(ys) + pad))
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        xs = [p.ratio_max or p.ratio for p in group]
        ax.set_xlim(min(0.9, min(p.ratio for p in group) - 0.1), max(xs) * 1.15)
        ax.set_xlabel(f"decode speed at {report.spec.speed_context} tokens, over dense (median, min-max)")
        ax.set_ylabel(f"needles found (of {group[0].total})")
        ax.set_title(f"{model}, KV {cache}")
        ax.text(0.99, 0.01, f"green: kept every needle {reference} found; red: lost some",
                transform=ax.transAxes, ha="right", va="bottom", fontsize="small", color="dimgrey")
        ax.grid(True, alpha=0.3)
    tasks = ", ".join(report.spec.tasks)
    contexts = ", ".join(str(c) for c in report.spec.context_lengths)
    fig.suptitle(f"gate {report.spec.name}: needles found against decode speed\n"
                 f"{tasks} at {contexts} tokens; speed at {report.spec.speed_context}")
    return save_figure(fig, path)


def run(ctx: GateContext) -> None:
    spec = ctx.spec
    needles.run(ctx)
    dense = spec.arms[0]
    arms = list(ctx.arms)
    for model in spec.models:
        for cache in spec.cache_types:
            for res in ab.measure(ctx, model, spec.speed_context, cache, 1, arms, dense, n_predict=SPEED_N_PREDICT):
                ctx.record(res)
                if res.error is None:
                    m = res.metrics
                    ctx.progress.log(f"  {res.arm} {model} @{spec.speed_context} {cache}: "
                                     f"{m['decode_tps_median']:.1f} tok/s, {m.get('ratio_median', 1.0):.2f}x dense")
                else:
                    ctx.progress.log(f"  {res.arm} {model} @{spec.speed_context}: ERROR {res.error.splitlines()[0]}")
    for p in points(ctx.report):
        if p.complete:
            ctx.progress.log(f"  frontier {p.arm} {p.cache_type}: {p.found}/{p.total} needles "
                             f"(lost {len(p.lost)}), {p.ratio:.2f}x dense")


# Nothing is judged (it sweeps lossy settings on purpose and records where each lands); the run
# passes when every part of every arm was measured.
KIND = Kind("frontier", run,
            keys=("tasks", "repeats", "calibration_samples", "shared_prefill", "only_samples", "speed_context"),
            min_arms=2, min_repeats=5, n_predict=128, first_arm_dense=True, markdown=markdown, plot=plot)
