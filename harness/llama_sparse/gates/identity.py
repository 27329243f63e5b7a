"""Identity gate: every arm must give the reference arm's tokens and logits, bit for bit.

With `upstream` as reference and `patched` (flags at their defaults) as the other arm, this is
the default-off proof; with a dense reference and a sparse arm that selects every block, it is
the select-all anchor. Logits come from llama-sparse-logits (full vectors from the decode path,
one token per step), tokens from greedy completions on llama-server. One differing bit fails.
"""

from __future__ import annotations

from llama_sparse.errors import ArmError
from llama_sparse.gates import logitsdump, texts
from llama_sparse.gates.context import GateContext
from llama_sparse.gates.report import ArmResult
from llama_sparse.gates.schema import Kind, Threshold
from llama_sparse.server import ServerProcess


def run(ctx: GateContext) -> None:
    spec = ctx.spec
    ref, others = spec.reference, [a for a in ctx.arms if a is not spec.reference]
    text = texts.reference_text()
    for model in spec.models:
        for n_ctx in spec.context_lengths:
            for cache in spec.cache_types:
                task = ctx.progress.task(f"identity {model} @{n_ctx} {cache}", total=spec.samples * len(ctx.arms))
                prompt_files = []
                for i in range(spec.samples):
                    # Different slices of the text: every prompt its own content and length.
                    p = ctx.out_dir / "prompts" / f"{model}-{n_ctx}-{i}.txt"
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_text(text[997 * i: 997 * i + 8 * n_ctx])
                    prompt_files.append(p)
                dumps: dict[str, list] = {}
                completions: dict[str, list[list[int]]] = {}
                errors: dict[str, str] = {}
                for arm in [ref, *others]:
                    try:
                        dumps[arm.name] = []
                        for i, pf in enumerate(prompt_files):
                            req = logitsdump.DumpRequest(
                                model=ctx.model_path(model), prompt_file=pf, ctx_size=n_ctx, steps=spec.n_predict,
                                out=ctx.out_dir / "dumps" / f"{arm.name}-{model}-{n_ctx}-{cache}-{i}.bin",
                                variant=arm.variant, cache_type=cache, threads=spec.threads, seed=spec.seed,
                                flags=arm.flags, prompt_tokens=n_ctx - spec.n_predict - 1 - 37 * i)
                            req.out.parent.mkdir(parents=True, exist_ok=True)
                            dumps[arm.name].append(logitsdump.run(req, ctx.log_path("dump", arm.name, model, n_ctx, cache, i)))
                            task.advance()
                        cfg = ctx.server_config(arm, model, n_ctx, cache)
                        with ServerProcess(cfg, ctx.log_path("server", arm.name, model, n_ctx, cache)) as server:
                            completions[arm.name] = [
                                server.complete(server.tokenize(pf.read_text(), add_special=True)[:d.n_prompt],
                                                n_predict=spec.n_predict, return_tokens=True,
                                                ignore_eos=True, cache_prompt=False)["tokens"]
                                for pf, d in zip(prompt_files, dumps[arm.name])]
                    except ArmError as e:
                        errors[arm.name] = str(e)
                for arm in others:
                    result = ArmResult(arm=arm.name, model=model, context=n_ctx, cache_type=cache)
                    err = errors.get(arm.name) or (f"reference arm {ref.name} failed:\n{errors[ref.name]}"
                                                   if ref.name in errors else None)
                    if err:
                        ctx.record(result.fail(err))
                        continue
                    diff_prompts, diff_steps = 0, 0
                    for i, (a, b) in enumerate(zip(dumps[ref.name], dumps[arm.name])):
                        cmp = logitsdump.compare(a, b)
                        tokens_same = completions[ref.name][i] == completions[arm.name][i]
                        same = a.raw == b.raw and tokens_same
                        diff_prompts += not same
                        diff_steps += cmp["diff_steps"]
                        result.samples.append({
                            "prompt": i, "prompt_tokens": a.n_prompt, "steps": cmp["steps"],
                            "logits_bit_identical": a.raw == b.raw, "diff_steps": cmp["diff_steps"],
                            "max_abs_diff": cmp["max_abs_diff"], "server_tokens_identical": tokens_same,
                            "server_tokens": completions[arm.name][i][:spec.n_predict],
                        })
                    result.metrics = {"prompts": float(spec.samples), "diff_prompts": float(diff_prompts),
                                      "diff_steps": float(diff_steps)}
                    ctx.record(result)
                    ctx.progress.log(f"  {arm.name} vs {ref.name}: {model} @{n_ctx} {cache}: "
                                     f"{spec.samples - diff_prompts}/{spec.samples} prompts bit-identical")


KIND = Kind(
    "identity", run, min_arms=2,
    thresholds={"max_diff_prompts": Threshold("prompts whose output differs from the reference arm", "diff_prompts",
                                              "max", 0, integer=True, default=0)})
