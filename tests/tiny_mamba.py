"""A tiny Mamba GGUF with random weights: a model whose memory is recurrent, not a KV cache,
so block-sparse attention cannot serve it. Written with the pinned tree's gguf-py."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llama_sparse.tinyqwen import byte_vocab, gguf_module, add_byte_vocab


def write_tiny_mamba(path: Path, n_layer: int = 2, n_embd: int = 64, seed: int = 7) -> Path:
    gguf = gguf_module()
    rng = np.random.default_rng(seed)
    tokens, types, merges = byte_vocab()
    d_inner, d_state, d_conv, dt_rank = 2 * n_embd, 16, 4, 8

    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_name("tiny-mamba")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)
    w.add_head_count(0)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(0)
    add_byte_vocab(w, tokens, types, merges)

    def t(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    n_vocab = len(tokens)
    w.add_tensor("token_embd.weight", t(n_vocab, n_embd, scale=1.0))
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(p + "ssm_in.weight", t(2 * d_inner, n_embd))
        w.add_tensor(p + "ssm_conv1d.weight", t(d_inner, d_conv))
        w.add_tensor(p + "ssm_conv1d.bias", t(d_inner))
        w.add_tensor(p + "ssm_x.weight", t(dt_rank + 2 * d_state, d_inner))
        w.add_tensor(p + "ssm_dt.weight", t(d_inner, dt_rank))
        w.add_tensor(p + "ssm_dt.bias", t(d_inner))
        w.add_tensor(p + "ssm_a", -np.abs(t(d_inner, d_state, scale=1.0)))
        w.add_tensor(p + "ssm_d", np.ones(d_inner, np.float32))
        w.add_tensor(p + "ssm_out.weight", t(n_embd, d_inner))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output.weight", t(n_vocab, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
