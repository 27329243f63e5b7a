"""`llama-sparse demo`: the README's main job, a short look at speed and retrieval on SmolLM2.

niah and ab at 4K and 8K for dense and, once the build has a sparse method, `--sparse-attn on`
with nothing else (what a user types); needles in prose with distractors (RULER's
niah_multikey_1, where a block selector can lose answers) beside the repeat haystack (the
control, where nothing is lost), few samples (the full gates are the YAML files in gates/). One
report, one table and one plot: niah score per task and sparse/dense decode ratio against
context length per arm.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from llama_sparse.binaries import binary
from llama_sparse.gates import ab, needles, report as reports
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.schema import Arm, GateSpec
from llama_sparse.progress import Progress

TASKS = ("niah_multikey_1", "niah_single_1")   # prose with distractors first; the repeat control
CONTEXTS = (4096, 7936)   # "4K" and "8K": SmolLM2's 8192 window less the 128-token answer and headroom


def server_help() -> str:
    out = subprocess.run([str(binary("llama-server")), "--help"], capture_output=True, text=True, timeout=60)
    return out.stdout + out.stderr


def default_sparse_arm(help_text: str) -> Arm | None:
    """`--sparse-attn on` as a user types it, with the coverage it reads by default (from the
    build's own help, for the bound column); None when the build has no sparse method. A help
    that names a coverage per score ("0.25 with the key sketch, 0.625 with the key bounds") gives
    the first: the CPU's, where the demo runs."""
    if "--sparse-attn" not in help_text:
        return None
    found = re.search(r"--sparse-attn-coverage F\s.*?default: ([0-9.]+)[ )]", help_text, re.S)
    return Arm(name="sparse-default", flags=("--sparse-attn", "on"), sparse=True,
               coverage=float(found.group(1)) if found else None)


def spec(model: str, samples: int, repeats: int, sparse: Arm | None) -> GateSpec:
    arms = (Arm(name="dense"),) + ((sparse,) if sparse else ())
    return GateSpec(path=Path("<demo>"), name="demo", kind="ab",
                    description="demo: niah and decode A/B on SmolLM2 at 4K and 8K",
                    models=(model,), context_lengths=CONTEXTS, cache_types=("f16",), arms=arms,
                    samples=samples, tasks=TASKS, repeats=repeats, n_predict=64, batch=(1,))


def run(out_root: Path, model: str = "smollm2-135m", samples: int = 4, repeats: int = 5) -> GateContext:
    sparse = default_sparse_arm(server_help())
    with_sparse = sparse is not None
    gate = spec(model, samples, repeats, sparse)
    out_dir = reports.run_dir(out_root, "demo")
    with Progress() as p:
        ctx = GateContext(spec=gate, out_dir=out_dir, progress=p, kind=ab.KIND)
        if not with_sparse:
            note = "this build has no sparse method yet (no --sparse-attn flag): only the dense arm runs"
            ctx.report.notes.append(note)
            p.log(note)
        try:
            for n_ctx in gate.context_lengths:
                samples_ = needles.make_samples(ctx, model, n_ctx, 128)
                speed = {r.arm: r for r in ab.measure(ctx, model, n_ctx, "f16", 1, list(gate.arms), gate.arms[0])}
                for arm in gate.arms:
                    found = needles.answer(ctx, arm, model, n_ctx, "f16", 128, samples_)
                    merged = speed[arm.name]
                    if found.error or merged.error:
                        merged.fail("\n".join(e for e in (merged.error, found.error) if e))
                    else:
                        merged.metrics.update({k: v for k, v in found.metrics.items() if k.startswith("niah")})
                        merged.samples = [{"decode": merged.samples}, {"niah": found.samples}]
                    ctx.record(merged)
                    m = merged.metrics
                    if merged.error is None:
                        per_task = ", ".join(f"{t} {m.get('niah:' + t, 0.0):.0%}" for t in gate.tasks)
                        p.log(f"  {arm.name} @{n_ctx}: niah {per_task}, decode {m['decode_tps_median']:.1f} tok/s"
                              + (f", {m['ratio_median']:.2f}x dense" if arm.sparse else ""))
        finally:
            ctx.report.finished = reports.now()
            ctx.save(final=True)
    return ctx
