"""Probe (run by hand): two llama-server builds decoding the same saved prompts in one run, rounds
interleaved, so that a kernel change is timed against the build before it on the same machine at
the same moment (a 2-core VM's speed drifts by a fifth between runs; `llama-sparse profile` times
one build).

Each round starts each build's server in turn (the order alternating), restores the prompt a
`llama-sparse profile` run saved for that context and flags, decodes 8 steps, then times 64 and
reads `timings.predicted_per_token_ms`; the medians and their ratio are printed per context. The
selections must not differ between builds whose change keeps the bits: the read fraction is
printed beside each timing.

    llama-sparse profile --context 32k --yarn-orig-ctx 8192 --slots /tmp/slots -- --sparse-attn on --sparse-attn-recheck 0
    python3 tools/probes/ab_builds.py --before /tmp/prev/bin/llama-server --after build/patched/bin/llama-server \\
        --slots /tmp/slots --contexts 8192,32768 --rounds 8 -- --rope-scaling yarn --rope-scale 4.0 \\
        --yarn-orig-ctx 8192 --sparse-attn on --sparse-attn-recheck 0
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from llama_sparse import models
from llama_sparse.gates.ab import prompt_tokens
from llama_sparse.profile import slot_name
from llama_sparse.server import ServerConfig, ServerProcess


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the llama-server to compare against")
    ap.add_argument("--after", type=Path, required=True, help="the llama-server being measured")
    ap.add_argument("--slots", type=Path, required=True, help="the saved prompts (llama-sparse profile --slots)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--contexts", default="8192,32768")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the server flags both builds get")
    args = ap.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    path = models.resolve(args.model, print)
    builds = {"before": args.before.resolve(), "after": args.after.resolve()}
    slots = args.slots.resolve()
    ms: dict[tuple[int, str], list[float]] = {}
    contexts = [int(c) for c in args.contexts.split(",")]
    for ctx in contexts:
        slot = slot_name(path, ctx, flags)
        if not (slots / slot).exists():
            raise SystemExit(f"no saved prompt {slots / slot}: run llama-sparse profile --context {ctx} with these flags first")
        for rnd in range(args.rounds):
            for name in ("before", "after") if rnd % 2 == 0 else ("after", "before"):
                cfg = ServerConfig(model=path, ctx_size=ctx + args.steps, threads=2, binary=builds[name],
                                   extra_args=["--slot-save-path", f"{slots}/", *flags])
                with ServerProcess(cfg, slots / f"ab-{name}-{ctx}.log") as server:
                    prompt = prompt_tokens(server, ctx - args.steps - 1)
                    server.request("POST", "/slots/0?action=restore", json={"filename": slot})
                    server.complete(prompt, 8, ignore_eos=True)
                    t = server.complete(prompt, args.steps, ignore_eos=True)["timings"]
                ms.setdefault((ctx, name), []).append(float(t["predicted_per_token_ms"]))
                read = (t.get("sparse") or {}).get("read_fraction")
                print(f"{ctx} {name:6} round {rnd}: {ms[(ctx, name)][-1]:.2f} ms a step, read fraction {read}", flush=True)
    print("\n| context | before, ms a step | after | after's speed |\n| --: | --: | --: | --: |")
    med = {k: statistics.median(v) for k, v in ms.items()}
    for ctx in contexts:
        b, a = med[(ctx, "before")], med[(ctx, "after")]
        print(f"| {ctx} | {b:.2f} | {a:.2f} | {b / a:.2f}x |")
    if len(contexts) > 1:
        lo, hi = contexts[0], contexts[-1]
        print(f"\nstep growth {lo} -> {hi}: before {med[(hi, 'before')] / med[(lo, 'before')]:.2f}x, "
              f"after {med[(hi, 'after')] / med[(lo, 'after')]:.2f}x ({args.rounds} rounds, medians)")


if __name__ == "__main__":
    main()
