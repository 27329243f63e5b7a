"""`llama-sparse profile`: where a decode step's time goes at a context, part by part.

A llama-server prefills a prompt of the context's length (or restores it from a slot saved by an
earlier run of the same model and length), then answers it again while `perf record` samples the
server from its first streamed token to its last, so the prompt's last row (evaluated again by
every request) stays out. Each sample goes to the first part its stack names, in PARTS' order
(the key sketch's scores, the walk over the ranked blocks, the reads of the selected blocks, ...);
a part's milliseconds are its share of the samples times the step's wall time, which is right
while every thread is busy (a thread waiting at a barrier spins, and is counted as waiting).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from llama_sparse import models
from llama_sparse.errors import UserError
from llama_sparse.gates.ab import prompt_tokens
from llama_sparse.server import ServerConfig, ServerProcess

# (part, substrings of a frame's symbol or library): a sample is the first part, in this order,
# that any frame of its stack names (a helper goes to the step it serves: the scoring kernel's
# log to the scores, a cluster read during an audit to the audit)
WAITING = "threads waiting (barriers)"  # a sample whose leaf is OpenMP's or ggml's barrier
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("key sketch: scores", ("sparse_attn_sketch",)),
    ("block selection: walk", ("sparse_attn_select", "sparse_attn_visible_blocks")),
    ("flash attention: selected blocks", ("flash_attn_ext_sparse_tiles",)),
    ("flash attention: rows, unread blocks' tail", ("flash_attn_ext",)),
    ("SCSA: exact steps (calibration, audits)", ("attend_calibrate", "attend_dense")),
    ("SCSA: plans, estimates, attention", ("scsa",)),
    ("weights (matrix products)", ("mul_mat", "ggml_gemm", "ggml_gemv")),
    ("key bounds and sketch: fill", ("sparse_attn_fill",)),
)
OTHER = "other (norms, RoPE, graph, server)"
# where no frame names a part: a stack cut at its leaf, whose quantized dot product is most
# likely the weights' (the unwinder lost its caller)
LEAF_ONLY: tuple[tuple[str, tuple[str, ...]], ...] = (("weights (matrix products)", ("ggml_vec_dot_q",)),)


@dataclass(frozen=True)
class Part:
    name: str
    share: float        # of the samples
    ms_per_step: float  # share * the step's wall time


@dataclass(frozen=True)
class Profile:
    context: int
    steps: int
    ms_per_step: float          # the sampled request's
    ms_per_step_unsampled: float  # the same request again, without perf
    samples: int
    parts: list[Part]
    sparse: dict | None  # the response's timings.sparse


def part_of(frames: list[str]) -> str:
    """The part a sample's stack (each frame 'symbol+off (library)') belongs to."""
    if frames and any(k in frames[0] for k in ("libgomp", "ggml_barrier")):
        return WAITING  # every OpenMP thread's stack ends in libgomp: only the leaf says it waits
    for parts in (PARTS, LEAF_ONLY):
        for name, keys in parts:
            if any(k in frame for frame in frames for k in keys):
                return name
    return OTHER


def samples_of(perf_script: str) -> list[list[str]]:
    """The stacks of `perf script` output, leaf first, each frame 'symbol+off (library)'."""
    stacks: list[list[str]] = []
    frames: list[str] | None = None
    for line in perf_script.splitlines():
        if not line.strip():
            if frames is not None:
                stacks.append(frames)
            frames = None
        elif line[0] not in " \t":
            if frames is not None:
                stacks.append(frames)
            frames = []  # a sample's header line
        elif frames is not None:
            # "\taddr symbol+0xoff (library)": drop the address
            frames.append(line.strip().partition(" ")[2])
    if frames is not None:
        stacks.append(frames)
    return stacks


def shares(stacks: list[list[str]]) -> dict[str, float]:
    counts = Counter(part_of(s) for s in stacks)
    total = sum(counts.values())
    return {name: n / total for name, n in counts.most_common()} if total else {}


def warmup_steps(flags: list[str]) -> int:
    """Steps decoded before the sampled request: 8, or with SCSA its calibration window too, so
    that the sampled steps are those of a calibrated server (each request still pays its audits)."""
    if "scsa" not in flags:
        return 8
    calib = 32
    if "--scsa-calib-steps" in flags[:-1]:
        calib = int(flags[flags.index("--scsa-calib-steps") + 1])
    return 8 + calib


def slot_name(model: Path, context: int, flags: list[str]) -> str:
    """The saved prompt's file: its model, length and the flags that change what a prefill writes
    (RoPE scaling, cache types, --sparse-prefill ...); the decode methods' own flags do not (a
    prompt is read densely under --sparse-attn on|scsa), so their runs share one prefill."""
    decode_only = ("--sparse-attn", "--scsa-")
    kept: list[str] = []
    skip_value = False
    for f in flags:
        if skip_value:
            skip_value = False
            continue
        if f.startswith(decode_only):
            skip_value = "=" not in f
            continue
        kept.append(f)
    key = hashlib.sha256("\0".join(kept).encode()).hexdigest()[:12]
    return f"{model.stem}-{context}-{key}.bin"


def run(model: str, context: int, n_predict: int, flags: list[str], out_dir: Path, slot_dir: Path | None,
        threads: int = 2, log=print) -> Profile:
    if not 1 <= n_predict < context - 16:
        raise UserError(f"profile: --n-predict {n_predict} must be at least 1 and well below --context {context}")
    if shutil.which("perf") is None:
        raise UserError("perf is not installed (Debian: apt-get install linux-perf)")
    path = models.resolve(model, log)
    out_dir.mkdir(parents=True, exist_ok=True)
    slot_dir = (slot_dir or out_dir / "slots").resolve()
    slot_dir.mkdir(parents=True, exist_ok=True)
    slot = slot_name(path, context, flags)
    cfg = ServerConfig(model=path, ctx_size=context + 64, threads=threads,
                       extra_args=["--slot-save-path", f"{slot_dir}/", *flags])
    data = out_dir / "perf.data"
    with ServerProcess(cfg, out_dir / "server.log") as server:
        prompt = prompt_tokens(server, context - n_predict - 1)
        if (slot_dir / slot).exists():
            log(f"restoring the {context}-token prompt from {slot_dir / slot}")
            server.request("POST", "/slots/0?action=restore", json={"filename": slot})
        else:
            log(f"prefilling {len(prompt)} tokens (saved to {slot_dir / slot} for the next run) ...")
            server.complete(prompt, 1)
            server.request("POST", "/slots/0?action=save", json={"filename": slot})
        server.complete(prompt, warmup_steps(flags), ignore_eos=True)
        perf: list[subprocess.Popen] = []

        def start() -> None:
            assert server.proc is not None
            perf.append(subprocess.Popen(["perf", "record", "-q", "-F", "999", "--call-graph", "dwarf,8192", "-p", str(server.proc.pid),
                                          "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        log(f"decoding {n_predict} tokens under perf ...")
        try:
            last = server.complete_streamed(prompt, n_predict, on_first_token=start, ignore_eos=True)
        finally:
            for p in perf:
                p.send_signal(signal.SIGINT)
                p.wait(timeout=120)
        # perf's unwinding slows the steps it samples: the same request once more, unsampled
        unsampled = server.complete(prompt, n_predict, ignore_eos=True).get("timings") or {}
    if not perf or not data.exists():
        raise UserError("perf recorded nothing (is perf allowed here? see /proc/sys/kernel/perf_event_paranoid)")
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,tid,time,event,ip,sym,dso"],
                            capture_output=True, text=True, check=True).stdout
    stacks = samples_of(script)
    t = last.get("timings") or {}
    ms = float(t.get("predicted_per_token_ms", 0.0))
    parts = [Part(name, s, s * ms) for name, s in shares(stacks).items()]
    return Profile(context, int(t.get("predicted_n", 0)), ms, float(unsampled.get("predicted_per_token_ms", 0.0)),
                   len(stacks), parts, t.get("sparse"))


def table(p: Profile) -> str:
    lines = [f"{p.steps} decode steps at {p.context} tokens, {p.ms_per_step:.1f} ms a step sampled "
             f"({p.ms_per_step_unsampled:.1f} ms unsampled), {p.samples} samples",
             "", "| part | share of samples | ms a step |", "| --- | --: | --: |"]
    lines += [f"| {x.name} | {100 * x.share:.1f}% | {x.ms_per_step:.1f} |" for x in p.parts]
    if p.sparse:
        lines += ["", "timings.sparse: " + json.dumps(p.sparse)]
    return "\n".join(lines)
