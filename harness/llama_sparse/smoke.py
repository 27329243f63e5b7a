"""`llama-sparse smoke`: one dense decode at a given depth on a real model, speed from the log."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llama_sparse import models
from llama_sparse.server import ServerConfig, ServerProcess
from llama_sparse.timings import RequestTiming

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"


@dataclass(frozen=True)
class SmokeResult:
    model: Path
    depth_tokens: int
    timing: RequestTiming
    text: str


def prompt_of_depth(server: ServerProcess, depth: int) -> list[int]:
    """A token prompt of exactly `depth` tokens cut from repeated filler text."""
    per_line = max(1, len(server.tokenize(FILLER)))
    text = FILLER * (depth // per_line + 2)
    return server.tokenize(text)[:depth]


def run(model: str, depth: int = 4096, n_predict: int = 64, threads: int | None = None,
        log_dir: Path = Path("results/smoke"), log=print) -> SmokeResult:
    path = models.resolve(model, log)
    cfg = ServerConfig(model=path, ctx_size=depth + n_predict + 64, threads=threads)
    with ServerProcess(cfg, log_dir / "server.log") as server:
        log(f"llama-server up ({server.props().get('llama_sparse') or 'upstream build'})")
        tokens = prompt_of_depth(server, depth)
        log(f"prefilling {len(tokens)} tokens and decoding {n_predict} ...")
        result, timing = server.complete_timed(tokens, n_predict=n_predict, ignore_eos=True)
    return SmokeResult(path, len(tokens), timing, result.get("content", ""))
