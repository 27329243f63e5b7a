"""Our DSO under llama-cpp-python, measured as a Python user meets it: `llama_cpp.Llama` on a real
model at a long context, in one process.

- sparse off: the logits of every teacher-forced step, bit for bit against the same code on
  upstream's libllama.so (run in a child process, since one process holds one libllama);
- sparse on and SCSA (their defaults): decode tokens/s against off's over the same steps, and the
  read fraction from llama_sparse_get_stats.

`llama-sparse python-check` runs it; the report is markdown and JSON under the output folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from llama_sparse.errors import UserError

MODES = ("off", "on", "scsa")


@dataclass(frozen=True)
class CheckConfig:
    model: Path
    context: int = 8192
    steps: int = 32          # teacher-forced steps compared bit for bit, and timed
    warmup: int = 33         # untimed decode steps first: SCSA calibrates on its first 32
    threads: int = 0         # 0: every core
    n_batch: int = 512

    @property
    def n_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    @property
    def n_prompt(self) -> int:
        return self.context - self.warmup - self.steps - 8


@dataclass
class ModeRun:
    mode: str
    library: str
    prefill_s: float
    decode_s: float                  # the timed steps
    tokens_per_s: float
    read_fraction: float | None = None
    stats: dict = field(default_factory=dict)
    upstream: bool = False           # run on upstream's libllama.so (the child process)


def stream(cfg: CheckConfig, tokenize) -> tuple[list[int], list[int]]:
    """The prompt and the forced continuation: Python's documentation prose, tokenized by the model."""
    from llama_sparse.gates.niah import prose_sentences

    need = cfg.n_prompt + cfg.warmup + cfg.steps + 1
    sentences = prose_sentences()
    text, tokens, i = "", [], 0
    while len(tokens) < need:
        chunk = " ".join(sentences[i:i + 400])
        i = (i + 400) % len(sentences)
        text += " " + chunk
        tokens = tokenize(text)
    return tokens[:cfg.n_prompt], tokens[cfg.n_prompt:need]


def run_mode(cfg: CheckConfig, mode: str, logits_out: Path | None = None) -> ModeRun:
    """One context on the library llama_cpp loaded: prefill, then every forced step, the last
    cfg.steps timed. Logits of the first cfg.steps + 1 rows go to logits_out (.npy) when asked."""
    import llama_cpp

    kwargs = dict(n_ctx=cfg.context, n_batch=cfg.n_batch, n_ubatch=cfg.n_batch, n_threads=cfg.n_threads,
                  n_threads_batch=cfg.n_threads, flash_attn=True, verbose=False)
    if mode == "off":
        llm = llama_cpp.Llama(model_path=str(cfg.model), **kwargs)   # upstream's API only
    else:
        from llama_sparse.python import sparse_llama

        llm = sparse_llama(cfg.model, mode, **kwargs)
    try:
        prompt, forced = stream(cfg, lambda text: llm.tokenize(text.encode(), add_bos=True, special=False))
        n_vocab = llm.n_vocab()

        def decode(tokens: list[int]) -> None:
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            if llama_cpp.llama_decode(llm.ctx, llama_cpp.llama_batch_get_one(arr, len(tokens))) != 0:
                raise RuntimeError(f"{mode}: llama_decode failed")

        def logits() -> np.ndarray:
            ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

        t0 = time.perf_counter()
        for i in range(0, len(prompt), cfg.n_batch):
            decode(prompt[i:i + cfg.n_batch])
        prefill_s = time.perf_counter() - t0
        rows = [logits()]
        t_timed = 0.0
        for step, token in enumerate(forced[:cfg.warmup + cfg.steps]):
            t = time.perf_counter()
            decode([token])
            dt = time.perf_counter() - t
            if step >= cfg.warmup:
                t_timed += dt
            if len(rows) <= cfg.steps:
                rows.append(logits())
        if logits_out is not None:
            np.save(logits_out, np.stack(rows))
        run = ModeRun(mode=mode, library=os.environ.get("LLAMA_CPP_LIB_PATH", ""), prefill_s=prefill_s,
                      decode_s=t_timed, tokens_per_s=cfg.steps / t_timed if t_timed > 0 else 0.0)
        if mode != "off":
            from llama_sparse.python import read_stats

            st = read_stats(llm)
            run.read_fraction = st.read_fraction
            run.stats = asdict(st)
        return run
    finally:
        llm.close()


@dataclass
class CheckResult:
    config: dict
    runs: list[ModeRun]
    identical_rows: int
    compared_rows: int
    first_difference: str | None

    def ours(self, mode: str) -> ModeRun:
        return next(r for r in self.runs if r.mode == mode and not r.upstream)

    def ratio(self, mode: str) -> float:
        """Decode tokens/s over sparse off's, both on our DSO in this process."""
        off = self.ours("off")
        return self.ours(mode).tokens_per_s / off.tokens_per_s if off.tokens_per_s else 0.0

    def markdown(self) -> str:
        cfg = self.config
        lines = [f"# llama-cpp-python on the llama-sparse DSO: {Path(cfg['model']).name} at {cfg['context']} tokens",
                 "",
                 f"`llama_cpp.Llama` (llama-cpp-python, built from its pinned sdist without its native library), "
                 f"flash attention on, {cfg['n_threads']} threads, prompt {cfg['n_prompt']} tokens of prose, then "
                 f"{cfg['warmup']} untimed and {cfg['steps']} timed teacher-forced decode steps.",
                 "",
                 f"**Sparse off against upstream's libllama.so**: {self.identical_rows} of {self.compared_rows} logits "
                 f"rows bit-identical (the prefill's last row and {cfg['steps']} decode steps)"
                 + (f"; first difference: {self.first_difference}" if self.first_difference else "") + ".",
                 "",
                 "| library | setting | prefill s | decode tok/s | over off | read |",
                 "|---|---|--:|--:|--:|--:|"]
        for r in self.runs:
            lib = "upstream" if r.upstream else "llama-sparse"
            over = "-" if r.upstream else f"{self.ratio(r.mode):.2f}x"
            read = "-" if r.read_fraction is None else f"{100 * r.read_fraction:.1f}%"
            lines.append(f"| {lib} | {r.mode} | {r.prefill_s:.1f} | {r.tokens_per_s:.2f} | {over} | {read} |")
        return "\n".join(lines) + "\n"


def compare(ours: np.ndarray, reference: np.ndarray) -> tuple[int, str | None]:
    n = min(len(ours), len(reference))
    same = 0
    first = None
    for i in range(n):
        if ours[i].shape == reference[i].shape and np.array_equal(ours[i].view(np.uint32), reference[i].view(np.uint32)):
            same += 1
        elif first is None:
            diff = np.abs(ours[i].astype(np.float64) - reference[i])
            first = f"row {i}, max |difference| {diff.max():.3g}"
    return same, first


def run(cfg: CheckConfig, out_dir: Path, upstream_lib: Path, our_lib: Path, log=print) -> CheckResult:
    """The whole check; this process must not have imported llama_cpp yet (it loads our DSO)."""
    if "llama_cpp" in sys.modules:
        raise UserError("python-check loads llama_cpp on our DSO itself: run it in a fresh process")
    out_dir.mkdir(parents=True, exist_ok=True)
    ref_path = out_dir / "upstream-off-logits.npy"
    log(f"upstream's libllama.so ({upstream_lib}), sparse off, in a child process ...")
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(upstream_lib)}
    for var in [v for v in env if v.startswith("LLAMA_SPARSE_") and v not in ("LLAMA_SPARSE_CACHE", "LLAMA_SPARSE_ROOT")]:
        env.pop(var)
    proc = subprocess.run([sys.executable, "-m", "llama_sparse.pycheck", json.dumps(_config_json(cfg)), str(ref_path)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"the upstream run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    upstream_run = ModeRun(**{**json.loads(proc.stdout.strip().splitlines()[-1]), "upstream": True})

    os.environ["LLAMA_CPP_LIB_PATH"] = str(our_lib)
    # "off" must be off: the LLAMA_SPARSE_* switch would turn it on for our DSO
    for var in [v for v in os.environ if v.startswith("LLAMA_SPARSE_") and v not in ("LLAMA_SPARSE_CACHE", "LLAMA_SPARSE_ROOT")]:
        os.environ.pop(var)
    runs = [upstream_run]
    ours_path = out_dir / "llama-sparse-off-logits.npy"
    for mode in MODES:
        log(f"llama-sparse's libllama.so ({our_lib}), sparse {mode} ...")
        runs.append(run_mode(cfg, mode, ours_path if mode == "off" else None))
        log(f"  {runs[-1].tokens_per_s:.2f} tok/s" + (f", read {100 * runs[-1].read_fraction:.1f}%" if runs[-1].read_fraction is not None else ""))
    same, first = compare(np.load(ours_path), np.load(ref_path))
    result = CheckResult(config=_config_json(cfg), runs=runs, identical_rows=same, compared_rows=cfg.steps + 1,
                         first_difference=first)
    stem = f"python-check-{cfg.model.stem}-{cfg.context}"
    (out_dir / f"{stem}.md").write_text(result.markdown())
    (out_dir / f"{stem}.json").write_text(json.dumps({**asdict(result), "ratios": {m: result.ratio(m) for m in MODES}}, indent=2))
    return result


def _config_json(cfg: CheckConfig) -> dict:
    return {"model": str(cfg.model), "context": cfg.context, "steps": cfg.steps, "warmup": cfg.warmup,
            "threads": cfg.threads, "n_threads": cfg.n_threads, "n_batch": cfg.n_batch, "n_prompt": cfg.n_prompt}


def _child(config_json: str, logits_out: str) -> None:
    """The upstream side: llama_cpp on the library LLAMA_CPP_LIB_PATH names, sparse off."""
    c = json.loads(config_json)
    cfg = CheckConfig(model=Path(c["model"]), context=c["context"], steps=c["steps"], warmup=c["warmup"],
                      threads=c["threads"], n_batch=c["n_batch"])
    print(json.dumps(asdict(run_mode(cfg, "off", Path(logits_out)))))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
