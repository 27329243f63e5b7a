"""Top-4 log-probabilities at each answer token of one needle prompt, for several builds and flags.

Each configuration gets its own llama-server that prefills the prompt itself (the user path) and
answers greedily; the gap between the chosen token and the runner-up at each token shows how much
a setting moves the answer. Used for 7K niah_multikey_2 #9 in docs/needles-in-prose.md:

    python probes/answer-margins.py OUT/samples/smollm2-135m-7168.json 9 \
        "build/patched/bin:" "build/patched/bin:--sparse-attn on" \
        "/tmp/probebin:--sparse-attn on:LLAMA_SPARSE_PROBE_TAIL=exact"

SAMPLES is the samples file a niah gate writes; each CONFIG is BIN_DIR:FLAGS[:ENV=VALUE,...].
"""
import argparse
import json
from pathlib import Path

from llama_sparse.models import resolve
from llama_sparse.server import ServerConfig, ServerProcess


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("samples", type=Path)
    ap.add_argument("index", type=int)
    ap.add_argument("configs", nargs="+", help="BIN_DIR:FLAGS[:ENV=VALUE,...]")
    ap.add_argument("--n-predict", type=int, default=9)
    ap.add_argument("--logs", type=Path, default=Path("/tmp/answer-margins"))
    args = ap.parse_args()
    model = resolve("smollm2-135m")
    sample = next(x for x in json.loads(args.samples.read_text()) if x["index"] == args.index)
    args.logs.mkdir(parents=True, exist_ok=True)
    for n, config in enumerate(args.configs):
        bindir, flags, envs = (config.split(":", 2) + ["", ""])[:3]
        env = {"LD_LIBRARY_PATH": bindir, **dict(e.split("=", 1) for e in envs.split(",") if e)}
        cfg = ServerConfig(model=model, ctx_size=sample["prompt_tokens"] + 128, threads=2, cache_type_k="f16",
                           cache_type_v="f16", extra_args=flags.split(), binary=Path(bindir) / "llama-server", env=env)
        with ServerProcess(cfg, args.logs / f"{n}.log") as server:
            r = server.complete(sample["prompt"], n_predict=args.n_predict, n_probs=4)
        print(f"== {bindir} [{flags}] {envs} -> {r['content']!r} (expected {sample['values']})", flush=True)
        for p in r["completion_probabilities"]:
            print(f"   {p['token']!r:8} " + " ".join(f"{t['token']!r}:{t['logprob']:.3f}" for t in p["top_logprobs"]))


if __name__ == "__main__":
    main()
