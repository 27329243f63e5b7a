"""The summary prompt of gates/ab-defaults-prose.yaml (f16, 8K, 128 tokens) with every step of the
block method computed again densely and logged (a build with recheck-delta.diff), once per setting:
NAME=LAYERS reads every block in layers LAYERS ("a-b", LLAMA_SPARSE_PROBE_DENSE_LAYERS; "none" for
the default), and EXTRA (the environment) adds flags, e.g. EXTRA="--sparse-attn-coverage 0.9
--sparse-attn-tolerance 0", and MODEL another GGUF (for example the same weights converted to F32
with llama-quantize --allow-requantize). Usage: python probes/recheck-delta-settings.py OUT_DIR NAME=LAYERS ...
"""
import os
import sys
from pathlib import Path

from llama_sparse.gates.ab import prompt_tokens
from llama_sparse.models import resolve
from llama_sparse.server import ServerConfig, ServerProcess

BIN = os.environ.get("LLAMA_SPARSE_BIN_DIR", "build/patched/bin")
EXTRA = os.environ.get("EXTRA", "").split()
out_dir = Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
model = Path(os.environ["MODEL"]) if os.environ.get("MODEL") else resolve("smollm2-135m")
for setting in sys.argv[2:]:
    name, layers = setting.split("=")
    out = out_dir / f"{name}.jsonl"
    out.unlink(missing_ok=True)
    env = {"LD_LIBRARY_PATH": BIN, "LLAMA_SPARSE_RECHECK_PROBE": str(out)}
    if layers != "none":
        env["LLAMA_SPARSE_PROBE_DENSE_LAYERS"] = layers
    cfg = ServerConfig(model=model, ctx_size=8192 + 64, threads=2, cache_type_k="f16", cache_type_v="f16",
                       extra_args=["--sparse-attn", "on", "--sparse-attn-recheck", "100"] + EXTRA,
                       binary=Path(BIN) / "llama-server", env=env)
    with ServerProcess(cfg, out_dir / f"{name}.log") as srv:
        srv.complete(prompt_tokens(srv, 8192 - 128 - 1, "prose"), 128, ignore_eos=True)
    print(name, "written to", out, flush=True)
