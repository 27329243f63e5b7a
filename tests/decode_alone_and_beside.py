"""N sequences of one context (a KV stream each, as llama-server's slots with --no-kv-unified)
decoded with the block method, teacher-forced, first each alone, then all in one batch a step:
per step, each sequence's largest logit difference from alone and whether it was computed again.
A third run prefills sequence 0 cut at another place. Prints JSON. Run by
tests/test_recheck_per_sequence.py in a process of its own (llama_cpp loads the library named by
LLAMA_CPP_LIB_PATH once).

    python tests/decode_alone_and_beside.py MODEL N_SEQ N_PROMPT N_STEPS
"""

import ctypes
import json
import random
import sys

import numpy as np
from llama_sparse.python import make_params
import llama_cpp

import teacher_forced

MODEL, N_SEQ, N_PROMPT, N_STEPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lib, model, n_vocab = teacher_forced.load(MODEL)
rng = random.Random(7)
prompts = [[rng.randrange(n_vocab) for _ in range(N_PROMPT)] for _ in range(N_SEQ)]
forced = [[rng.randrange(n_vocab) for _ in range(N_STEPS)] for _ in range(N_SEQ)]


def context():
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_seq_max, cp.kv_unified, cp.n_batch, cp.n_ubatch = 4096*N_SEQ, N_SEQ, False, 2048, 512
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = 1
    p = make_params("on", sparse_attn_min_kv=0)  # the block method at every length
    ctx = lib.llama_sparse_init_from_model(model, cp, ctypes.byref(p))
    assert ctx
    return ctx


def decode(ctx, entries):  # entries: (token, pos, seq, output)
    return teacher_forced.decode(ctx, entries, n_vocab, N_SEQ)


def rechecked(ctx, seq):
    return teacher_forced.rechecked(lib, ctx, seq)[0]


def run(joint, first_cut=None):
    """first_cut: where sequence 0's prompt is first cut (then every 512 tokens from there), as
    a server cuts a prompt where other slots' tokens leave room"""
    ctx = context()
    for s in range(N_SEQ):
        start = [0] + ([first_cut] if s == 0 and first_cut else [])
        cuts = start + list(range(start[-1] + 512, N_PROMPT, 512)) + [N_PROMPT]
        for a, b in zip(cuts, cuts[1:]):
            decode(ctx, [(t, a + i, s, False) for i, t in enumerate(prompts[s][a:b])])
    logits = {s: [] for s in range(N_SEQ)}
    again = []
    for k in range(N_STEPS):
        before = [rechecked(ctx, s) for s in range(N_SEQ)]
        for g in ([list(range(N_SEQ))] if joint else [[s] for s in range(N_SEQ)]):
            for s, r in zip(g, decode(ctx, [(forced[s][k], N_PROMPT + k, s, True) for s in g])):
                logits[s].append(r)
        again.append([rechecked(ctx, s) - before[s] for s in range(N_SEQ)])
    llama_cpp.llama_free(ctx)
    return logits, again


alone, beside, recut = run(False), run(True), run(False, first_cut=300)
print(json.dumps({
    "again": {"alone": alone[1], "beside": beside[1]},
    "max_abs_diff": [[float(np.max(np.abs(a - b))) for a, b in zip(alone[0][s], beside[0][s])] for s in range(N_SEQ)],
    "recut_max_abs_diff": [float(np.max(np.abs(a - b))) for a, b in zip(alone[0][0], recut[0][0])],
}))
