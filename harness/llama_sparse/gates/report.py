"""What a gate run leaves on disk: results/<gate>-<YYYYmmdd-HHMMSS>/{report.json,report.md,plot.png}.

`write` is meant to be called after every arm, so that a server that dies later in the run
leaves everything measured so far behind; every file is replaced atomically. An arm that
failed (server died, timed out) carries its error text and never a score: its metrics are
dropped when it is recorded, and it counts as failed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from llama_sparse.errors import UserError
from llama_sparse.gates.schema import Arm, GateSpec, Kind

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PLOT_PNG = "plot.png"
SCHEMA = 1


@dataclass
class ArmResult:
    arm: str
    model: str
    context: int
    cache_type: str
    batch: int = 1
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)   # every raw sample
    calibration: list[dict] = field(default_factory=list)  # niah: unscored answers given first
    error: str | None = None     # server died / timed out: the error text with its log tail
    passed: bool | None = None

    def fail(self, error: str) -> "ArmResult":
        """Mark this result as errored: the error replaces any score, and it does not pass."""
        self.error = error
        self.metrics = {}
        self.passed = False
        return self

    def to_dict(self) -> dict[str, Any]:
        errored = self.error is not None
        return {
            "arm": self.arm, "model": self.model, "context": self.context,
            "cache_type": self.cache_type, "batch": self.batch,
            "metrics": {} if errored else dict(self.metrics),   # an error is never a score
            "samples": list(self.samples), "error": self.error,
            "passed": False if errored else self.passed,
            **({"calibration": list(self.calibration)} if self.calibration else {}),
        }


@dataclass
class GateReport:
    spec: GateSpec
    started: str
    finished: str | None = None
    machine: dict = field(default_factory=dict)   # from machine_info()
    builds: dict = field(default_factory=dict)    # {"patched": {"build_info": ..., "llama_sparse": ...}, ...}
    models: dict = field(default_factory=dict)    # name -> {"path": ..., "sha256": ...}
    results: list[ArmResult] = field(default_factory=list)
    passed: bool | None = None
    notes: list[str] = field(default_factory=list)
    cut_short: str | None = None  # why the run stopped before its end (an interrupt, a harness error)
    kind: Kind | None = None      # how its kind extends the common report (not written to report.json)

    def verdict(self) -> bool | None:
        """`passed`, except that an errored or failed result always makes the gate fail, and a run
        cut short has no verdict otherwise (what it did not measure cannot pass)."""
        if any(r.error is not None or r.passed is False for r in self.results):
            return False
        return None if self.cut_short else self.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "gate": self.spec.name, "kind": self.spec.kind,
            "spec": self.spec.to_dict(), "started": self.started, "finished": self.finished,
            "machine": self.machine, "builds": self.builds, "models": self.models,
            "results": [r.to_dict() for r in self.results], "passed": self.verdict(),
            "notes": list(self.notes), **({"cut_short": self.cut_short} if self.cut_short else {}),
        }


def now() -> str:
    """The local time, ISO 8601 with offset, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def run_dir(out_root: Path, gate: str, when: float | None = None) -> Path:
    """A fresh results/<gate>-<YYYYmmdd-HHMMSS>/ under `out_root` (suffixed -2, -3 ... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    path = out_root / f"{gate}-{stamp}"
    n = 2
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path = out_root / f"{gate}-{stamp}-{n}"
            n += 1


# ---------------------------------------------------------------------------------------------
# the machine

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    """The SIMD features llama.cpp's CPU kernels depend on."""
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
              "amx_tile", "asimd", "sve", "i8mm", "dotprod", "asimddp")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                have = set(value.split())
                return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine_info() -> dict:
    """Where the numbers were measured: host, CPU, cores, memory, Python, OS."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    mem = _memory_bytes()
    return {
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "memory_bytes": mem,
        "memory_gib": round(mem / 2**30, 1) if mem else None,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


# ---------------------------------------------------------------------------------------------
# JSON

def _jsonable(value: Any) -> Any:
    """Plain JSON: non-finite floats become null (strict JSON has no NaN), paths strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item") and callable(value.item):   # numpy scalars
        try:
            return _jsonable(value.item())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays
        return _jsonable(value.tolist())
    return str(value)


def _replace_atomically(path: Path, write) -> None:
    """`write(file)` into a temporary file beside `path`, then put it in place of `path`: a
    reader sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _write_atomic(path: Path, data: bytes) -> None:
    _replace_atomically(path, lambda f: f.write(data))


def _spec_from_dict(d: dict[str, Any]) -> GateSpec:
    known = {f.name for f in fields(GateSpec)}
    values: dict[str, Any] = {}
    for key, value in d.items():
        if key not in known:
            continue  # a key of a later harness: not needed to draw the results
        if key == "arms":
            value = tuple(Arm(**{**a, "flags": tuple(a.get("flags", ())),
                                 "env": tuple(sorted(a.get("env", {}).items()))}) for a in value)
        elif key == "path":
            value = Path(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[key] = value
    return GateSpec(**values)


def load(out_dir: Path) -> GateReport:
    """The report of an earlier run from its report.json (to draw it again with this harness)."""
    path = Path(out_dir) / REPORT_JSON
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no report.json there (is it a gate's results folder?)") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not a readable report ({e})") from None
    if d.get("schema") != SCHEMA:
        raise UserError(f"{path}: report schema {d.get('schema')!r}, this harness reads {SCHEMA}")
    results = []
    for r in d["results"]:
        res = ArmResult(r["arm"], r["model"], r["context"], r["cache_type"], batch=r.get("batch", 1),
                        metrics=dict(r.get("metrics", {})), samples=list(r.get("samples", [])),
                        calibration=list(r.get("calibration", [])), error=r.get("error"), passed=r.get("passed"))
        results.append(res)
    report = GateReport(spec=_spec_from_dict(d["spec"]), started=d["started"], finished=d.get("finished"),
                        machine=d.get("machine", {}), builds=d.get("builds", {}), models=d.get("models", {}),
                        results=results, notes=list(d.get("notes", [])), cut_short=d.get("cut_short"))
    report.passed = d.get("passed")
    return report


def write(report: GateReport, out_dir: Path) -> dict[str, Path]:
    """Write report.json, report.md and (if there is anything to plot) plot.png; safe to repeat."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / REPORT_JSON, "md": out_dir / REPORT_MD}
    text = json.dumps(_jsonable(report.to_dict()), indent=2, allow_nan=False) + "\n"
    _write_atomic(paths["json"], text.encode())
    _write_atomic(paths["md"], markdown_table(report).encode())
    png = plot(report, out_dir / PLOT_PNG)
    if png is not None:
        paths["png"] = png
    return paths


# ---------------------------------------------------------------------------------------------
# markdown

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


# a needle the reference finds by a smaller decisive margin (nats) is marked thin: on SmolLM2 at
# 7K dense found one by 0.13 that dense with a q4_0 KV cache lost, and each build width moves it
THIN_MARGIN_NATS = 0.25


def needle_id(record: dict) -> str:
    return f"{record['task']}#{record['index']}"


def compare_needles(reference: list[dict], other: list[dict]) -> tuple[list[str], list[str]]:
    """Needle by needle: (the needles the reference found and `other` did not, the reverse)."""
    ref = {needle_id(x): x["score"] == 1.0 for x in reference}
    got = {needle_id(x): x["score"] == 1.0 for x in other}
    lost = [k for k, found in ref.items() if found and got.get(k) is False]
    gained = [k for k, found in got.items() if found and ref.get(k) is False]
    return lost, gained


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


# ---------------------------------------------------------------------------------------------
# plot

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
    panels = [p for p in (("tps", tps), ("ratio", ratio), ("niah", niah)) if p[1]]
    if not panels:
        return None

    # Figure + the Agg canvas directly: no pyplot, no global backend switch, no state left behind.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator, PercentFormatter

    vary = {"model": len({r.model for r in ok}) > 1, "cache": len({r.cache_type for r in ok}) > 1,
            "batch": len({r.batch for r in ok}) > 1}
    fig = Figure(figsize=(6.4 * len(panels), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
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
            else:
                ax.plot(xs, [r.metrics["niah"] for r in points], marker="o", label=label)
        if what == "tps":
            ax.set_ylim(bottom=0)
            ax.set_ylabel("decode tokens/s (median)")
            ax.set_title("decode speed against context")
        elif what == "ratio":
            ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
            ax.set_ylabel("decode speed, sparse / dense (median, min-max)")
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


def save_figure(fig, path: Path) -> Path:
    """The figure as a PNG, replaced atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace_atomically(path, lambda f: fig.savefig(f, format="png", dpi=100))
    return path
