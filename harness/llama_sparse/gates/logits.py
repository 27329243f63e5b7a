"""Logits gate: teacher-forced agreement of each arm with the reference arm.

The reference (first) arm decodes its own greedy stream after a fixed long text; every other
arm is fed exactly that stream, so step i of every arm sees the same tokens. Per arm: top-1
agreement, mean and max KL(reference || arm) of the next-token distributions (full vocab,
from the logits), and the number of steps whose logits differ at all.
"""

from __future__ import annotations

import numpy as np

from llama_sparse.errors import ArmError
from llama_sparse.gates import logitsdump, texts
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.report import ArmResult
from llama_sparse.gates.schema import Kind, Threshold


def run(ctx: GateContext) -> None:
    spec = ctx.spec
    ref = spec.reference
    text = texts.reference_text()
    for model in spec.models:
        for n_ctx in spec.context_lengths:
            prompt = ctx.out_dir / "prompts" / f"{model}-{n_ctx}.txt"
            prompt.parent.mkdir(parents=True, exist_ok=True)
            prompt.write_text(text[: 8 * n_ctx])
            for cache in spec.cache_types:
                task = ctx.progress.task(f"logits {model} @{n_ctx} {cache}", total=len(ctx.arms))

                def dump(arm, force=None):
                    req = logitsdump.DumpRequest(
                        model=ctx.model_path(model), prompt_file=prompt, ctx_size=n_ctx, steps=spec.samples,
                        out=ctx.out_dir / "dumps" / f"{arm.name}-{model}-{n_ctx}-{cache}.bin", variant=arm.variant,
                        cache_type=cache, threads=spec.threads, seed=spec.seed, flags=arm.flags, force=force,
                        prompt_tokens=n_ctx - spec.samples - 1, env=arm.env)
                    req.out.parent.mkdir(parents=True, exist_ok=True)
                    ctx.build_info(arm.variant)
                    out = logitsdump.run(req, ctx.log_path("dump", arm.name, model, n_ctx, cache))
                    task.advance()
                    return out

                try:
                    reference = dump(ref)
                except ArmError as e:
                    for arm in ctx.arms:
                        ctx.record(ArmResult(arm.name, model, n_ctx, cache).fail(f"reference arm {ref.name}: {e}"))
                    continue
                stream = ctx.out_dir / "dumps" / f"stream-{model}-{n_ctx}-{cache}.bin"
                reference.tokens[:-1].astype(np.int32).tofile(stream)
                for arm in ctx.arms:
                    if arm is ref:
                        continue
                    result = ArmResult(arm.name, model, n_ctx, cache)
                    try:
                        other = dump(arm, force=stream)
                    except ArmError as e:
                        ctx.record(result.fail(str(e)))
                        continue
                    m = logitsdump.compare(reference, other, spec.skip_steps)
                    result.metrics = {k: float(v) for k, v in m.items()}
                    result.samples = [{"step": i, "ref_top1": int(reference.logits[i].argmax()),
                                       "arm_top1": int(other.logits[i].argmax())}
                                      for i in range(spec.skip_steps, spec.skip_steps + int(m["steps"]))]
                    ctx.record(result)
                    ctx.progress.log(f"  {arm.name}: top-1 {m['top1']:.1%}, KL mean {m['kl_mean']:.2e} "
                                     f"max {m['kl_max']:.2e}, {m['diff_steps']} of {m['steps']} steps differ")


KIND = Kind(
    "logits", run, keys=("skip_steps",),
    min_arms=2,
    thresholds={
        "max_kl_mean": Threshold("mean KL divergence from the reference arm, per step", "kl_mean", "max", 0),
        "max_kl_max": Threshold("largest KL divergence from the reference arm at any step", "kl_max", "max", 0),
        "min_top1": Threshold("fraction of steps whose top-1 token matches the reference", "top1", "min", 0, 1),
        "max_diff_steps": Threshold("steps whose logits differ from the reference at all", "diff_steps", "max",
                                    0, integer=True),
    })
