"""Calibrate SCSA on a request that retrieves nothing, as a server whose first request is a chat
would, and write the taus it froze (gates/taus/README.md).

    python3 scripts/scsa-taus-from-summary.py OUT.json [N_TOKENS] [MODEL]

The request: about N_TOKENS (default 4000) tokens of the prose haystack the needle gates use
(Python's documentation topics, from sentence 900 on, no needle in it), then "Summarize the text
above in three sentences." answered greedily for 64 tokens with `--sparse-attn scsa` and its
defaults. SCSA calibrates during the first 32 of those steps and writes its taus once frozen.
"""
import sys
import tempfile
import time
from pathlib import Path

from llama_sparse.gates.niah import prose_sentences
from llama_sparse.models import resolve
from llama_sparse.server import ServerConfig, ServerProcess


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = Path(sys.argv[1]).resolve()
    n_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
    model = resolve(sys.argv[3] if len(sys.argv) > 3 else "smollm2-135m")
    out.unlink(missing_ok=True)
    cfg = ServerConfig(model=model, ctx_size=max(8192, n_tokens + 1024), threads=2,
                       extra_args=["--sparse-attn", "scsa", "--scsa-taus-out", str(out)])
    sentences = prose_sentences()
    log = Path(tempfile.gettempdir()) / "scsa-taus-from-summary.server.log"  # not beside the taus in the repository
    with ServerProcess(cfg, log) as server:
        text, i = "", 900
        while len(server.tokenize(text)) < n_tokens:
            text += " ".join(sentences[i:i + 40]) + " "
            i += 40
        prompt = text + "\n\nSummarize the text above in three sentences.\nSummary:"
        started = time.time()
        answer = server.complete(prompt, n_predict=64, temperature=0)["content"]
        print(f"{len(server.tokenize(prompt))} prompt tokens, {time.time() - started:.0f} s: {answer[:200]!r}")
        for _ in range(50):  # the taus are written once every head froze, after the response
            if out.exists() and out.stat().st_size > 0:
                break
            time.sleep(0.2)
    if not out.exists():
        sys.exit(f"no taus written to {out}: see {log}")
    print(f"taus written to {out}")


if __name__ == "__main__":
    main()
