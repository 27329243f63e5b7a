"""Two sequences of one context decoded step by step, first each alone, then side by side in
one batch (a KV stream each, teacher-forced tokens): per step, each sequence's logits and whether
the sparse recheck computed its step again. Prints JSON. Run by tests/test_recheck_per_sequence.py
in a process of its own (llama_cpp loads the library named by LLAMA_CPP_LIB_PATH once).

    python tests/recheck_alone_and_beside.py MODEL N_PROMPT N_STEPS

A third run decodes side by side with a backend (greedy) sampler on sequence 1: its tokens, and
sequence 0's recheck, must be what they are without it.
"""

import ctypes
import json
import random
import sys

import numpy as np
from llama_sparse.python import make_params
import llama_cpp

import teacher_forced

MODEL, N_PROMPT, N_STEPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lib, model, n_vocab = teacher_forced.load(MODEL)
rng = random.Random(7)
prompts = [[rng.randrange(n_vocab) for _ in range(N_PROMPT)] for _ in range(2)]
forced = [[rng.randrange(n_vocab) for _ in range(5*N_STEPS)] for _ in range(2)]
CHUNK = 4  # the second phase: sequence 1 sends 4 tokens a step, every one an output (more outputs than sequences)

def context(mode="on"):
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_seq_max, cp.kv_unified, cp.n_batch, cp.n_ubatch = 4096, 2, False, 512, 512
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = 1
    # the block method at every length (its default minimum keeps short contexts dense)
    p = make_params(mode, **({"sparse_attn_min_kv": 0} if mode == "on" else {}))
    ctx = lib.llama_sparse_init_from_model(model, cp, ctypes.byref(p))
    assert ctx
    return ctx

SAMPLED = 1  # the sequence given a backend sampler in the third run


def decode(ctx, entries, sampled_seq=None):  # entries: (token, pos, seq, output)
    return teacher_forced.decode(ctx, entries, n_vocab, 2, sampled_seq)

def rechecked(ctx, seq):
    return teacher_forced.rechecked(lib, ctx, seq)

def prefill(ctx, seq):
    toks = prompts[seq]
    for c in range(0, len(toks), 512):
        decode(ctx, [(t, c + i, seq, False) for i, t in enumerate(toks[c:c+512])])

def run(joint, backend_sampler=False):
    ctx = context()
    sampled_seq = None
    if backend_sampler:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        assert llama_cpp.llama_set_sampler(ctx, SAMPLED, chain)
        sampled_seq = SAMPLED
    for s in (0, 1):
        prefill(ctx, s)
    logits = {0: [], 1: []}; per_step = []
    for k in range(N_STEPS):
        before = [rechecked(ctx, s)[0] for s in (0, 1)]
        groups = [[0, 1]] if joint else [[0], [1]]
        for g in groups:
            rows = decode(ctx, [(forced[s][k], N_PROMPT + k, s, True) for s in g], sampled_seq)
            for s, r in zip(g, rows):
                logits[s].append(r)
        per_step.append(tuple(rechecked(ctx, s)[0] - before[s] for s in (0, 1)))
    # second phase: sequence 0 decodes a step while sequence 1 sends a chunk of several tokens, read
    # densely as a prompt's; only sequence 0's doubt may take its own step back
    chunk = {0: [], 1: []}; per_step_chunk = []
    for k in range(N_STEPS // 2):
        before = [rechecked(ctx, s)[0] for s in (0, 1)]
        entries = {0: [(forced[0][N_STEPS + k], N_PROMPT + N_STEPS + k, 0, True)],
                   1: [(forced[1][N_STEPS + CHUNK*k + i], N_PROMPT + N_STEPS + CHUNK*k + i, 1,
                        sampled_seq != 1 or i == CHUNK - 1) for i in range(CHUNK)]}  # a backend sampler takes one output
        groups = [entries[0] + entries[1]] if joint else [entries[0], entries[1]]
        for g in groups:
            rows = decode(ctx, g, sampled_seq)
            for e, r in zip(g, rows):
                if r is not None:
                    chunk[e[2]].append(r)
        per_step_chunk.append(tuple(rechecked(ctx, s)[0] - before[s] for s in (0, 1)))
    for s in (0, 1):
        logits[s].extend(chunk[s])
    per_step.extend(per_step_chunk)
    counts = [rechecked(ctx, s) for s in (0, 1)]
    llama_cpp.llama_free(ctx)
    return logits, per_step, counts

def caller_recheck():
    """llama_sparse_recheck_row, as a sampler with a grammar calls it: the two sequences side by side;
    on each step whose row of sequence 0 read sparsely, its recheck is asked for. Per step: the
    margin before and after, whether sequence 1's logits stayed bit for bit, sequence 0's logits
    against the same step in a dense context (sparse attention off), and its rechecked count."""
    lib.llama_sparse_recheck_margin.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.llama_sparse_recheck_margin.restype = ctypes.c_float
    lib.llama_sparse_recheck_row.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.llama_sparse_recheck_row.restype = ctypes.c_int32
    ctx, dense = context(), context("off")
    for c in (ctx, dense):
        for s in (0, 1):
            prefill(c, s)
    steps = []
    for k in range(N_STEPS):
        entries = [(forced[s][k], N_PROMPT + k, s, True) for s in (0, 1)]
        rows = decode(ctx, entries)
        want = decode(dense, entries)
        margin = lib.llama_sparse_recheck_margin(ctx, 0)
        before = rechecked(ctx, 0)[0]
        rc = lib.llama_sparse_recheck_row(ctx, 0)
        after = [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in (0, 1)]
        steps.append({"margin": float(margin), "rc": int(rc), "margin_after": float(lib.llama_sparse_recheck_margin(ctx, 0)),
                      "rechecked": rechecked(ctx, 0)[0] - before,
                      "seq1_unchanged": bool(np.array_equal(after[1], rows[1])),
                      "seq0_moved": float(np.max(np.abs(after[0] - rows[0]))),
                      "seq0_vs_dense": float(np.max(np.abs(after[0] - want[0])))})
    return steps


alone = run(False)
beside = run(True)
alone_sampled = run(False, backend_sampler=True)
beside_sampled = run(True, backend_sampler=True)
print(json.dumps({
    "rechecked_per_step": {"alone": alone[1], "beside": beside[1]},
    "counts": {"alone": alone[2], "beside": beside[2]},
    "max_abs_diff": [[float(np.max(np.abs(a - b))) for a, b in zip(alone[0][s], beside[0][s])] for s in (0, 1)],
    "caller": caller_recheck(),
    "backend_sampler": {
        "rechecked_per_step": {"alone": alone_sampled[1], "beside": beside_sampled[1]},
        "sampled_tokens": {"alone": [int(r[0]) for r in alone_sampled[0][SAMPLED]],
                           "beside": [int(r[0]) for r in beside_sampled[0][SAMPLED]]},
        "max_abs_diff_seq0": [float(np.max(np.abs(a - b))) for a, b in zip(alone[0][0], beside_sampled[0][0])],
    },
}))
