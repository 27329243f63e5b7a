"""`llama-sparse demo`: the README's main job, the two things that matter in minutes on SmolLM2.

Answers: needles in prose with distractors (RULER's niah_multikey_1, where a block selector can
lose answers), dense and `--sparse-attn on` (what a user types) needle by needle. Each prompt is
prefilled once, by dense, and both arms answer from that cache (a slot saved and restored): the
prefill is dense in both, so what differs is their decode alone, as in the gates' shared prefill.
Speed: decode tokens/s of both arms at 8K in one run, interleaved rounds, the sparse/dense ratio.
`--full` runs the longer look: needles at 4K and 8K on the prose task and the repeat haystack
(the control, where nothing is lost), with more samples, and speed at both lengths. One report,
one table and one plot; the full gates are the YAML files in gates/.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from llama_sparse.binaries import binary
from llama_sparse.gates import ab, needles, output, report as reports
from llama_sparse.gates.markdown import tokens_label
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.report import ArmResult
from llama_sparse.gates.schema import Arm, GateSpec
from llama_sparse.progress import Progress

N_PREDICT_NEEDLE = 32   # a 7-digit answer and its words fit (the prose gates answer in 32)


@dataclass(frozen=True)
class DemoPlan:
    """What a demo run measures: needles at some contexts, decode speed at others."""
    needle_contexts: tuple[int, ...]
    tasks: tuple[str, ...]
    samples: int                 # needles per task and context
    speed_contexts: tuple[int, ...]
    repeats: int = 5             # interleaved A/B rounds (the ab gates' least)
    n_predict: int = 64          # tokens per A/B round

    def prefill_tokens(self, n_arms: int) -> int:
        """Prompt tokens the run prefills: each needle prompt once, each arm's speed prompt."""
        return (sum(self.samples * len(self.tasks) * n for n in self.needle_contexts)
                + sum(n_arms * n for n in self.speed_contexts))


# "8K" is 7936: SmolLM2's 8192 window less an answer and headroom
QUICK = DemoPlan(needle_contexts=(7936,), tasks=("niah_multikey_1",), samples=4, speed_contexts=(7936,))
FULL = DemoPlan(needle_contexts=(4096, 7936), tasks=("niah_multikey_1", "niah_single_1"), samples=8,
                speed_contexts=(4096, 7936))


def server_help() -> str:
    out = subprocess.run([str(binary("llama-server")), "--help"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def default_sparse_arm(help_text: str) -> Arm | None:
    """`--sparse-attn on` as a user types it, with the coverage it reads by default (from the
    build's own help, for the bound column); None when the build has no sparse method. A help
    that names a coverage per score ("0.5 with the key sketch, 0.625 with the key bounds") gives
    the first: the CPU's, where the demo runs."""
    if "--sparse-attn" not in help_text:
        return None
    found = re.search(r"--sparse-attn-coverage F\s.*?default: ([0-9.]+)[ )]", help_text, re.S)
    return Arm(name="sparse-default", flags=("--sparse-attn", "on"), sparse=True,
               coverage=float(found.group(1)) if found else None)


def spec(model: str, plan: DemoPlan, sparse: Arm | None) -> GateSpec:
    arms = (Arm(name="dense"),) + ((sparse,) if sparse else ())
    contexts = tuple(sorted(set(plan.needle_contexts) | set(plan.speed_contexts)))
    return GateSpec(path=Path("<demo>"), name="demo", kind="ab",
                    description=f"demo: needles in prose with distractors and decode A/B on {model}",
                    models=(model,), context_lengths=contexts, cache_types=("f16",), arms=arms,
                    samples=plan.samples, tasks=plan.tasks, repeats=plan.repeats, n_predict=plan.n_predict,
                    batch=(1,))


class TimeLeft:
    """An estimate of the time left from the prefill done so far: prefill is most of the demo's
    time on a CPU, so seconds per prompt token so far times the tokens still to prefill."""

    def __init__(self, total_tokens: int) -> None:
        self.total = total_tokens
        self.done = 0
        self.started = time.monotonic()

    def advance(self, tokens: int) -> str:
        self.done += tokens
        elapsed = time.monotonic() - self.started
        left = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        return f"{elapsed / 60:.1f} min so far, about {left / 60:.0f} min left"


@dataclass
class DemoRun:
    """A demo's report and its results by part."""
    ctx: GateContext
    needles: list[ArmResult] = field(default_factory=list)
    speed: list[ArmResult] = field(default_factory=list)

    def summary(self) -> str:
        """The demo's answer in one table, an arm per row: needles found per context (and lost
        against dense), decode speed per context with its ratio to dense, what the arm read and
        how many of its steps it computed again densely."""
        needle_ctx = sorted({r.context for r in self.needles})
        speed_ctx = sorted({r.context for r in self.speed})
        header = (["arm"] + [f"needles at {tokens_label(n)}" for n in needle_ctx]
                  + [f"decode at {tokens_label(n)}" for n in speed_ctx]
                  + ["KV blocks read", "steps computed again"])
        lines = ["| " + " | ".join(header) + " |", "|---|" + "--:|" * (len(header) - 1)]
        for arm in (a.name for a in self.ctx.spec.arms):
            row, read, again = [arm], "-", "-"
            for n in needle_ctx:
                r = next((x for x in self.needles if x.arm == arm and x.context == n), None)
                if r is None or r.error is not None:
                    row.append("-" if r is None else "error")
                    continue
                lost = r.metrics.get("lost_vs_reference")
                row.append(f"{sum(x['score'] == 1.0 for x in r.samples)} of {len(r.samples)}"
                           + (f" ({lost:.0f} lost)" if lost is not None else ""))
            for n in speed_ctx:
                r = next((x for x in self.speed if x.arm == arm and x.context == n), None)
                if r is None or r.error is not None:
                    row.append("-" if r is None else "error")
                    continue
                m = r.metrics
                row.append(f"{m['decode_tps_median']:.1f} tok/s"
                           + (f" ({m['ratio_median']:.2f}x)" if "ratio_median" in m and arm != self.ctx.spec.arms[0].name else ""))
                if "read_fraction" in m:
                    read = f"{m['read_fraction']:.0%}"
                if "rechecked_fraction" in m:
                    again = f"{m['rechecked_fraction']:.1%}"
            lines.append("| " + " | ".join(row + [read, again]) + " |")
        return "\n".join(lines)


def run(out_root: Path, model: str = "smollm2-135m", plan: DemoPlan = QUICK) -> DemoRun:
    sparse = default_sparse_arm(server_help())
    gate = spec(model, plan, sparse)
    arms = list(gate.arms)
    out_dir = output.run_dir(out_root, "demo")
    clock = TimeLeft(plan.prefill_tokens(len(arms)))
    with Progress() as p:
        ctx = GateContext(spec=gate, out_dir=out_dir, progress=p, kind=ab.KIND)
        demo = DemoRun(ctx)
        if sparse is None:
            note = "this build has no sparse method yet (no --sparse-attn flag): only the dense arm runs"
            ctx.report.notes.append(note)
            p.log(note)
        p.log(f"demo: {plan.samples} needles per task ({', '.join(plan.tasks)}) at "
              f"{', '.join(tokens_label(n) for n in plan.needle_contexts)}, each prefilled once and answered "
              f"by {' and '.join(a.name for a in arms)}; decode speed at "
              f"{', '.join(tokens_label(n) for n in plan.speed_contexts)}, {plan.repeats} rounds of "
              f"{plan.n_predict} tokens per arm; {clock.total} prompt tokens to prefill in all")
        try:
            for n_ctx in plan.needle_contexts:
                samples = needles.make_samples(ctx, model, n_ctx, N_PREDICT_NEEDLE)
                results = needles.answer_shared(ctx, arms, model, n_ctx, "f16", N_PREDICT_NEEDLE, samples)
                demo.needles += results
                for r in results:
                    if r.error is None and r is not results[0] and results[0].error is None:
                        needles.count_against_reference(results[0], r)
                    if r.error is None:
                        found = [f"{t} {r.metrics.get('niah:' + t, 0.0):.0%}" for t in plan.tasks]
                        p.log(f"  {r.arm} @{tokens_label(n_ctx)}: needles {', '.join(found)} "
                              f"({sum(x['score'] == 1.0 for x in r.samples)} of {len(r.samples)} found)")
                    else:
                        p.log(f"  {r.arm} @{tokens_label(n_ctx)}: ERROR {r.error.splitlines()[0]}")
                p.log(f"  {clock.advance(len(samples) * n_ctx)}")
            for n_ctx in plan.speed_contexts:
                for r in ab.measure(ctx, model, n_ctx, "f16", 1, arms, arms[0]):
                    ctx.record(r)
                    demo.speed.append(r)
                    m = r.metrics
                    p.log(f"  {r.arm} @{tokens_label(n_ctx)}: "
                          + (f"decode {m['decode_tps_median']:.1f} tok/s"
                             + (f", {m['ratio_median']:.2f}x dense" if "ratio_median" in m else "")
                             if r.error is None else f"ERROR {r.error.splitlines()[0]}"))
                p.log(f"  {clock.advance(len(arms) * n_ctx)}")
        finally:
            ctx.report.finished = reports.now()
            ctx.save(final=True)
    if sparse is not None:
        ctx.report.notes.append("Needles: each prompt prefilled once by dense, both arms answering from that "
                                "cache; decode: interleaved rounds of both arms in one run, median tokens/s and "
                                "the ratio to dense's round beside it")
        ctx.save(final=True)
    return demo
