"""How many decode steps are in doubt: the share of greedy steps whose two best tokens are within
0.1 / 0.25 / 0.5 nats, dense against --sparse-attn on, on a 256-token summary of one 7K prose prompt
(the haystack of niah_multikey_2 #9 without its question). What a dense recompute of such steps
would cost. Usage: python probes/thin-steps.py SAMPLES_JSON [BIN_DIR]
"""
import json
import sys
from pathlib import Path
from llama_sparse.models import resolve
from llama_sparse.server import ServerConfig, ServerProcess
S = json.loads(Path(sys.argv[1]).read_text())
BIN = sys.argv[2] if len(sys.argv) > 2 else "build/patched/bin"
p = next(x for x in S if x["index"] == 9)["prompt"]
cut = p.rfind("What is the special magic number")
text = p[:cut] if cut > 0 else p[: len(p) * 9 // 10]
prompt = text + "\n\nWrite a summary of the text above in a few paragraphs.\nSummary:"
model = resolve("smollm2-135m")
for flags in ["", "--sparse-attn on"]:
    cfg = ServerConfig(model=model, ctx_size=8192 + 512, threads=2, cache_type_k="f16", cache_type_v="f16",
                       extra_args=flags.split(), binary=Path(BIN) / "llama-server", env={"LD_LIBRARY_PATH": BIN})
    with ServerProcess(cfg, Path(f"/tmp/thin-steps-{len(flags)}.log")) as srv:
        r = srv.complete(prompt, n_predict=256, n_probs=2, ignore_eos=True)
    gaps = [s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"] for s in r["completion_probabilities"][1:]]
    n = len(gaps)
    print(f"[{flags or 'dense'}] prompt {r['timings']['prompt_n']} tokens, {n} decode steps: gap<0.1 {sum(g<0.1 for g in gaps)/n:.1%}, <0.25 {sum(g<0.25 for g in gaps)/n:.1%}, <0.5 {sum(g<0.5 for g in gaps)/n:.1%}; text {r['content'][:80]!r}", flush=True)
