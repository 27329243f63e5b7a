"""What the teacher-forced scripts (recheck_alone_and_beside.py, decode_alone_and_beside.py) share:
one batch of given tokens decoded through llama_cpp, and a sequence's recheck count."""

import ctypes

import numpy as np
import llama_cpp
from llama_sparse.python import _SparseStats


def decode(ctx, entries, n_vocab: int, n_seq_max: int, sampled_seq=None):
    """entries: (token, pos, seq, output). The output rows' logits (None for a token without an
    output); a backend-sampled sequence's row is its sampled token (its raw logits may not reach
    the host)."""
    batch = llama_cpp.llama_batch_init(len(entries), 0, n_seq_max)
    for i, (tok, pos, seq, out) in enumerate(entries):
        batch.token[i] = tok; batch.pos[i] = pos; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = seq; batch.logits[i] = out
    batch.n_tokens = len(entries)
    rc = llama_cpp.llama_decode(ctx, batch)
    assert rc == 0, rc
    rows = [(np.array([llama_cpp.llama_get_sampled_token_ith(ctx, i)], dtype=np.float32) if e[2] == sampled_seq else
             np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()) if e[3] else None
            for i, e in enumerate(entries)]
    llama_cpp.llama_batch_free(batch)
    return rows


def rechecked(lib, ctx, seq: int) -> tuple[int, int]:
    """(steps computed again, steps read sparsely) of a sequence so far."""
    st = _SparseStats()
    assert lib.llama_sparse_get_stats(ctx, seq, ctypes.byref(st), False)
    return st.steps_rechecked, st.steps_sparse


def load(path: str):
    """(our library with llama_sparse_init_from_model typed, the model, its vocabulary size)"""
    from llama_sparse.python import _library

    lib = _library()
    lib.llama_sparse_init_from_model.argtypes = [ctypes.c_void_p, llama_cpp.llama_context_params, ctypes.c_void_p]
    lib.llama_sparse_init_from_model.restype = ctypes.c_void_p
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    return lib, model, llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
