"""A gate's report.md: a header (gate, builds, machine, verdict), one row per result, and the
tables a kind adds (needle by needle, request by request under load)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from llama_sparse.gates.report import THIN_MARGIN_NATS, ArmResult, GateReport, needle_id


def tokens_label(tokens: int) -> str:
    """1024 -> 1K, 1536 -> 1.5K, 500 -> 500."""
    if tokens >= 1024 and tokens % 256 == 0:
        return f"{tokens / 1024:g}K"
    return str(tokens)


def format_metric(name: str, value: Any) -> str:
    """Ratios as 2.31x, tokens/s with one decimal, scores and shares as percentages."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    n = name.lower()
    if n.startswith("ratio") or n.endswith("_ratio") or n.startswith("speedup") or n == "bound":
        return f"{value:.2f}x"
    if "tps" in n or n.endswith("_per_s"):
        return f"{value:.1f}"
    if n in ("niah", "score", "top1", "bound_share") or n.startswith(("niah", "score", "top1")) \
            or n.endswith(("_score", "_share", "_top1", "_frac", "_fraction")):
        pct = value * 100
        return f"{pct:.0f}%" if abs(pct - round(pct)) < 1e-9 else f"{pct:.1f}%"
    if "kl" in n.split("_"):
        return f"{value:.3g}"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:.4g}"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _result_cell(r: ArmResult) -> str:
    if r.error is not None:
        first = next((line.strip() for line in r.error.splitlines() if line.strip()), "(no message)")
        return f"ERROR: {first}"
    return {True: "pass", False: "FAIL", None: ""}[r.passed]


def _builds_lines(builds: dict) -> list[str]:
    lines = []
    for variant, info in builds.items():
        if isinstance(info, dict):
            parts = [f"{k} {v}" for k, v in info.items() if v not in (None, "", {})]
            lines.append(f"- build `{variant}`: {'; '.join(_cell(p) for p in parts) or '-'}")
        else:
            lines.append(f"- build `{variant}`: {_cell(info)}")
    return lines


def markdown_table(report: GateReport) -> str:
    """A header (gate, kind, builds, machine, time, verdict) and one table row per result."""
    spec = report.spec
    kind = report.kind
    verdict = report.verdict()
    status = {True: "PASS", False: "FAIL",
              None: "CUT SHORT" if report.cut_short else "incomplete" if report.finished is None else "no verdict"}[verdict]
    out = [f"# Gate `{spec.name}` ({spec.kind}): {status}", ""]
    if spec.description:
        out += [spec.description, ""]
    out.append(f"- started {report.started}, finished {report.finished or '(still running)'}")
    if report.cut_short:
        out.append(f"- cut short ({report.cut_short}): below is what was measured before; an arm "
                   "with no score was stopped before its answers were scored")
    out += _builds_lines(report.builds)
    m = report.machine
    if m:
        cores = m.get("cores_usable") or m.get("cores")
        mem = f", {m['memory_gib']} GiB" if m.get("memory_gib") else ""
        out.append(f"- machine: {m.get('hostname', '?')}, {m.get('cpu', '?')}, {cores} cores{mem}")
    if spec.thresholds:
        out.append("- thresholds: " + ", ".join(f"{k} {v:g}" for k, v in spec.thresholds.items()))
    out.append("")

    columns: list[str] = []
    for r in report.results:
        if r.error is None:
            for name in r.metrics:
                if name not in columns:
                    columns.append(name)
    header = ["arm", "model", "context", "cache", "B", *columns, "result"]
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "|".join(["---"] * 4 + ["--:"] * (1 + len(columns)) + ["---"]) + "|")
    for r in report.results:
        row = [r.arm, Path(r.model).name if r.model.endswith(".gguf") else r.model,
               tokens_label(r.context), r.cache_type, str(r.batch)]
        row += ["-" if r.error is not None else format_metric(c, r.metrics.get(c)) for c in columns]
        row.append(_result_cell(r))
        out.append("| " + " | ".join(_cell(c) for c in row) + " |")
    if not report.results:
        out.append("| " + " | ".join(["(no results yet)"] + [""] * (len(header) - 1)) + " |")

    errored = [r for r in report.results if r.error is not None]
    if errored:
        out += ["", "## Errors"]
        for r in errored:
            out += ["", f"### {r.arm} / {r.model} / {tokens_label(r.context)} / {r.cache_type} / B={r.batch}",
                    "", "```", r.error.rstrip().replace("```", "`\u200b``"), "```"]
    out += _needle_table(report)
    out += _mix_table(report)
    if kind is not None and kind.markdown is not None:
        out += kind.markdown(report)
    calibrated = [r for r in report.results if r.calibration]
    if calibrated:
        out += ["", "## Calibration questions (answered first, not scored)", ""]
        for r in calibrated:
            found = sum(1 for c in r.calibration if c["score"] == 1.0)
            answers = "; ".join(f"`{c['expected'][0]}` at depth {c['depth']:.2f}: "
                                f"`{' '.join(c['output'].split())[:24]}`" for c in r.calibration)
            out.append(f"- {r.arm} / {tokens_label(r.context)}: {found} of {len(r.calibration)} found ({answers})")
    if report.notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(out) + "\n"


def _needle_table(report: GateReport) -> list[str]:
    """Every needle of each (model, context, cache) by arm, alone (B=1): `found`, or the start
    of the wrong answer; a needle the first arm found and another lost is marked LOST (niah and
    frontier gates, the demo: any result whose samples are needles)."""
    groups: dict[tuple, list[ArmResult]] = {}
    for r in report.results:
        if r.error is None and r.batch == 1 and r.samples and "task" in r.samples[0]:
            groups.setdefault((r.model, r.context, r.cache_type), []).append(r)
    out: list[str] = []
    for (model, context, cache), results in groups.items():
        if len(results) < 2:
            continue
        ref = results[0]
        margins = any("margin" in x for x in ref.samples)
        out += ["", f"## Needle by needle: {model}, {tokens_label(context)}, {cache} (against {ref.arm})", "",
                "| needle | depth | " + (f"{ref.arm}'s margin | " if margins else "")
                + " | ".join(r.arm for r in results) + " |",
                "|---|--:|" + ("--:|" if margins else "") + "---|" * len(results)]
        by_arm = [{(x["task"], x["index"]): x for x in r.samples} for r in results]
        thin = []
        for key, first in by_arm[0].items():
            margin = ""
            if margins:
                m = first.get("margin")
                is_thin = m is not None and m < THIN_MARGIN_NATS and first["score"] == 1.0
                margin = "- | " if m is None else f"{m:.2f}{' (thin)' if is_thin else ''} | "
                if is_thin:
                    thin.append(f"{key[0]}#{key[1]}")
            cells = []
            for i, samples in enumerate(by_arm):
                x = samples.get(key)
                if x is None:
                    cells.append("-")
                elif x["score"] == 1.0:
                    cells.append("found")
                else:
                    answer = " ".join(x["output"].split())[:14] or "(empty)"
                    lost = i > 0 and first["score"] == 1.0
                    cells.append(("LOST " if lost else "") + f"`{answer}`")
            out.append(f"| {key[0]}#{key[1]} | {first['depth']:.2f} | {margin}" + " | ".join(_cell(c) for c in cells) + " |")
        if margins:
            out += ["", f"Margin: the smallest gap, in nats, between {ref.arm}'s answer token and its runner-up over the "
                    f"tokens that spell the answer's value. Needles {ref.arm} finds by less than {THIN_MARGIN_NATS} nats "
                    "(\"thin\": a cache type or a SIMD width can flip them in a dense run as well): "
                    + (", ".join(thin) if thin else "none") + "."]
    return out


def _mix_table(report: GateReport) -> list[str]:
    """niah with a mix: each request alone and under load, by arm: found or missed, the same
    answer or another under load, and its steps computed again of its sparse steps (from the
    responses' timings)."""
    if not getattr(report.spec, "mix", ()):
        return []
    runs: dict[tuple, dict[int, ArmResult]] = {}
    for r in report.results:
        if r.error is None and r.samples and "request" in r.samples[0]:
            runs.setdefault((r.model, r.context, r.cache_type, r.arm), {})[r.batch] = r
    out: list[str] = []
    arms = list(dict.fromkeys(k[3] for k in runs))
    for model, context, cache in dict.fromkeys(k[:3] for k in runs):
        pairs = []
        for arm in arms:
            by_batch = runs.get((model, context, cache, arm), {})
            loaded = [b for b in sorted(by_batch) if b > 1]
            if 1 in by_batch and loaded:
                pairs.append((arm, by_batch[1], by_batch[loaded[0]]))
        if not pairs:
            continue
        b = pairs[0][2].batch
        out += ["", f"## Under load, request by request: {model}, {tokens_label(context)}, {cache} (B={b} against alone)", "",
                "| needle | request | " + " | ".join(f"{arm} alone | {arm} B={b}" for arm, _, _ in pairs) + " |",
                "|---|---|" + "---|---|" * len(pairs)]

        def steps(x: dict) -> str:
            return f", {x['rechecked'][0]} of {x['rechecked'][1]} again" if x.get("rechecked") else ""
        for i, first in enumerate(pairs[0][1].samples):
            cells = []
            for _, alone, loaded in pairs:
                a = alone.samples[i] if i < len(alone.samples) else None
                x = loaded.samples[i] if i < len(loaded.samples) else None
                if a is None or x is None:
                    cells += ["-", "-"]
                    continue
                cells.append(("found" if a["score"] == 1.0 else "missed") + steps(a))
                cells.append(("same" if x["output"] == a["output"] else "CHANGED") + steps(x))
            out.append(f"| {needle_id(first)} | {first['request']} | " + " | ".join(_cell(c) for c in cells) + " |")
        out += ["", "\"N of M again\": of the request's M decode steps read sparsely, N computed again densely "
                "(--sparse-attn-recheck), as its response's `timings.sparse` says. A greedy or JSON request that answers "
                "as alone (the same text in as many tokens) must be computed again where it is alone, and no arm may "
                "change more of their answers than the first; sampled ones are shown, not judged."]
    return out

