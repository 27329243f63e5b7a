"""A gate's plot.png: speed and needles against context, one line per arm. `figure` and `save`
are the plotting helpers every plot of the harness draws with."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from llama_sparse.files import replace_atomically
from llama_sparse.gates.markdown import tokens_label
from llama_sparse.gates.report import ArmResult, GateReport


def _series_label(r: ArmResult, vary: dict[str, bool]) -> str:
    parts = [r.arm]
    if vary["model"]:
        parts.append(Path(r.model).name if r.model.endswith(".gguf") else r.model)
    if vary["cache"]:
        parts.append(r.cache_type)
    if vary["batch"]:
        parts.append(f"B={r.batch}")
    return " ".join(parts)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def plot(report: GateReport, path: Path) -> Path | None:
    """Speed ratio and niah score vs context, one line per arm; None when there is nothing to plot.
    A kind with a plot of its own (frontier: needles against speed) draws that instead."""
    kind = report.kind
    if kind is not None and kind.plot is not None:
        return kind.plot(report, path)
    ok = [r for r in report.results if r.error is None]
    ratio = [r for r in ok if _finite(r.metrics.get("ratio_median"))]
    niah = [r for r in ok if _finite(r.metrics.get("niah"))]
    # a cost curve (speed at several contexts): tokens/s themselves, with the bound of each point
    tps = [r for r in ok if _finite(r.metrics.get("decode_tps_median"))]
    tps = tps if len({r.context for r in tps}) > 1 else []
    # and on a cost curve, the part of a step that grows with the context (context_ms), log-log:
    # dense's doubles with the context, a flat line is a step that stopped growing
    context = [r for r in tps if _finite(r.metrics.get("context_ms")) and r.metrics["context_ms"] > 0]
    # a time-to-first-token curve: the prompt's time against its length, log-log (dense's
    # attention grows with the square of the length)
    prompt = [r for r in ok if _finite(r.metrics.get("prompt_ms_median"))]
    speed_of = "prompt" if prompt else "decode"
    prompt = prompt if len({r.context for r in prompt}) > 1 else []
    panels = [p for p in (("prompt", prompt), ("tps", tps), ("context", context), ("ratio", ratio), ("niah", niah)) if p[1]]
    if not panels:
        return None

    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, PercentFormatter

    vary = {"model": len({r.model for r in ok}) > 1, "cache": len({r.cache_type for r in ok}) > 1,
            "batch": len({r.batch for r in ok}) > 1}
    fig = figure(len(panels), (6.4, 4.8))
    for i, (what, rs) in enumerate(panels):
        contexts = sorted({r.context for r in rs})
        ax = fig.add_subplot(1, len(panels), i + 1)
        series: dict[str, list[ArmResult]] = {}
        for r in rs:
            series.setdefault(_series_label(r, vary), []).append(r)
        for label, points in series.items():
            points.sort(key=lambda r: r.context)
            xs = [r.context for r in points]
            if what == "ratio":
                ys = [r.metrics["ratio_median"] for r in points]
                lo = [max(0.0, y - r.metrics["ratio_min"]) if _finite(r.metrics.get("ratio_min")) else 0.0
                      for y, r in zip(ys, points)]
                hi = [max(0.0, r.metrics["ratio_max"] - y) if _finite(r.metrics.get("ratio_max")) else 0.0
                      for y, r in zip(ys, points)]
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=4, label=label)
            elif what == "tps":
                line = ax.plot(xs, [r.metrics["decode_tps_median"] for r in points], marker="o", label=label)[0]
                # the bound in tokens/s: dense's speed at that depth (its median step time) times
                # the bound the arm's coverage allows there
                bounded = [(r.context, 1000.0 / r.metrics["tfull_ms"] * r.metrics["bound"]) for r in points
                           if _finite(r.metrics.get("bound")) and _finite(r.metrics.get("tfull_ms"))]
                if bounded:
                    ax.plot(*zip(*bounded), linestyle=":", marker=".", color=line.get_color(),
                            label=f"{label}: bound of its coverage")
            elif what == "context":
                ax.plot(xs, [r.metrics["context_ms"] for r in points], marker="o", label=label)
            elif what == "prompt":
                ax.plot(xs, [r.metrics["prompt_ms_median"] / 1000.0 for r in points], marker="o", label=label)
            else:
                ax.plot(xs, [r.metrics["niah"] for r in points], marker="o", label=label)
        if what == "prompt":
            ax.set_yscale("log")
            ax.set_ylabel("prompt evaluation, s (median)")
            ax.set_title("time to first token against context")
        elif what == "context":
            ax.set_yscale("log")
            ax.set_ylabel("ms per token less dense's at depth 16 (median)")
            ax.set_title("the part of a step that grows with the context")
        elif what == "tps":
            ax.set_ylim(bottom=0)
            ax.set_ylabel("decode tokens/s (median)")
            ax.set_title("decode speed against context")
        elif what == "ratio":
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.set_ylabel(f"{speed_of} speed, sparse / dense (median, min-max)")
            ax.set_title("speed ratio")
        else:
            ax.set_ylim(-0.05, 1.05)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_ylabel("niah score")
            ax.set_title("needle retrieval")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(contexts))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: tokens_label(int(round(x)))))
        if len(contexts) == 1:
            ax.set_xlim(contexts[0] / 1.5, contexts[0] * 1.5)
        ax.set_xlabel("context (tokens)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")

    models = sorted({Path(r.model).name if r.model.endswith(".gguf") else r.model for r in ok})
    caches = sorted({r.cache_type for r in ok})
    title = f"gate {report.spec.name} ({report.spec.kind}): {', '.join(models)}, KV {', '.join(caches)}"
    n_err = len(report.results) - len(ok)
    if n_err:
        title += f"\n{n_err} errored result{'s' if n_err > 1 else ''} not plotted (see report.md)"
    fig.suptitle(title)
    return save_figure(fig, path)


def figure(n_panels: int, panel_size: tuple[float, float]):
    """A matplotlib Figure of `n_panels` side by side on the Agg canvas directly: no pyplot, no
    global backend switch, no state left behind."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width, height = panel_size
    fig = Figure(figsize=(width * n_panels, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: Path) -> Path:
    """The figure as a PNG, replaced atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, lambda f: fig.savefig(f, format="png", dpi=100))
    return path
