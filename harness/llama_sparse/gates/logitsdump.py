"""Run our llama-sparse-logits tool and read what it writes (see tools/logits/main.cpp)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llama_sparse.binaries import binary
from llama_sparse.errors import ArmError

MAGIC = 0x474C534C


@dataclass
class LogitsDump:
    n_prompt: int
    tokens: np.ndarray     # int32 [rows]: the token fed after each row (last row: greedy pick)
    logits: np.ndarray     # float32 [rows, n_vocab]
    raw: bytes             # the rows as written, for bit-exact comparison


def read(path: Path) -> LogitsDump:
    data = path.read_bytes()
    header = np.frombuffer(data, dtype=np.int32, count=5)
    if header[0] != MAGIC or header[1] != 1:
        raise ArmError(f"{path} is not a llama-sparse-logits dump")
    n_vocab, n_prompt, rows = (int(x) for x in header[2:5])
    body = data[20:]
    rec = np.dtype([("token", np.int32), ("logits", np.float32, (n_vocab,))])
    arr = np.frombuffer(body, dtype=rec, count=rows)
    return LogitsDump(n_prompt=n_prompt, tokens=arr["token"].copy(), logits=arr["logits"].copy(), raw=body)


@dataclass(frozen=True)
class DumpRequest:
    model: Path
    prompt_file: Path
    ctx_size: int
    steps: int
    out: Path
    variant: str = "patched"
    cache_type: str = "f16"
    threads: int | None = None
    seed: int = 42
    flags: tuple[str, ...] = ()
    force: Path | None = None
    prompt_tokens: int | None = None   # cut the tokenized prompt to this many tokens
    env: tuple[tuple[str, str], ...] = ()   # the arm's environment variables, over ours


def run(req: DumpRequest, log_path: Path, timeout: float = 3600) -> LogitsDump:
    exe = binary("llama-sparse-logits", req.variant)
    cmd = [str(exe), "-m", str(req.model), "-f", str(req.prompt_file), "-c", str(req.ctx_size),
           "-fa", "on", "-ctk", req.cache_type, "-ctv", req.cache_type, "--seed", str(req.seed),
           "--dump-steps", str(req.steps), "--dump-out", str(req.out), *req.flags]
    if req.threads:
        cmd += ["-t", str(req.threads), "-tb", str(req.threads)]
    if req.prompt_tokens is not None:
        cmd += ["--dump-prompt-tokens", str(req.prompt_tokens)]
    if req.force is not None:
        cmd += ["--dump-force", str(req.force)]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join([f"{k}={v}" for k, v in req.env] + cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                              env={**os.environ, **dict(req.env)})
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise ArmError(f"llama-sparse-logits exited with code {proc.returncode}\n--- {log_path} ---\n{tail}")
    return read(req.out)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def compare(ref: LogitsDump, other: LogitsDump, skip: int = 0) -> dict[str, float]:
    """Per-step agreement of `other` with `ref` over the rows both have, from row `skip` on."""
    end = min(len(ref.tokens), len(other.tokens))
    if skip >= end:
        raise ValueError(f"skip {skip} leaves none of the {end} rows to compare")
    a, b = ref.logits[skip:end], other.logits[skip:end]
    rows = end - skip
    p, q = softmax(a), softmax(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(p > 0, p * (np.log(p) - np.log(np.maximum(q, 1e-300))), 0.0).sum(axis=-1)
    diff_rows = int(sum(1 for i in range(rows) if a[i].tobytes() != b[i].tobytes()))
    return {
        "steps": rows,
        "top1": float(np.mean(a.argmax(-1) == b.argmax(-1))),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "diff_steps": diff_rows,
        "max_abs_diff": float(np.abs(a - b).max()),
    }
