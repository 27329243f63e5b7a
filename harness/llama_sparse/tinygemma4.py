"""tiny-gemma4: a Gemma 4 target and its Gemma 4 assistant (a draft on the target's KV cache),
GGUFs with random weights written by our own code.

The assistant (`gemma4-assistant`, upstream's MTP drafter for Gemma 4) keeps no KV cache of its
own: its context is created with the target's context as `ctx_other`, its sliding-window layers
read the target's last sliding-window layer and its full-attention layers the target's last
full-attention layer. So the pair has to agree: the target ends in one sliding-window layer and
one full-attention layer, the assistant's heads read the target's cache rows (same KV heads,
head size and window), and the assistant's `embedding_length_out` is the target's hidden size
(it takes the target's hidden state and token embeddings in). Same shape and seed give the same
two files, byte for byte; like tiny-qwen3 they are written with the pinned tree's gguf-py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from llama_sparse.errors import UserError
from llama_sparse.tinyqwen import (RandomWeights, add_byte_vocab, add_decoder_geometry, byte_vocab, cached, gguf_module,
                                   require_positive)

TARGET_ARCH = "gemma4"
ASSISTANT_ARCH = "gemma4-assistant"
ROPE_FREQ_BASE = 1_000_000.0
ROPE_FREQ_BASE_SWA = 10_000.0
RMS_EPS = 1e-6


@dataclass(frozen=True)
class TinyGemma4Shape:
    n_layer: int = 2              # the target's layers: all sliding-window but the last
    n_embd: int = 64              # the target's hidden size, the assistant's backbone size
    n_head: int = 2
    n_head_kv: int = 1            # the assistant reads these heads of the target's cache
    head_dim: int = 32            # a multiple of 32, as the key sketch of --sparse-attn needs
    n_ff: int = 128
    n_swa: int = 64               # the sliding window, in tokens
    n_ctx: int = 8192
    assistant_n_layer: int = 2    # all sliding-window but the last, as the target
    assistant_n_embd: int = 32    # must differ from n_embd: the loader requires it
    assistant_n_head: int = 2
    assistant_n_ff: int = 64
    seed: int = 4

    def validate(self) -> None:
        require_positive(self, "tiny-gemma4")
        # upstream's Gemma 4 KV layout asserts two layers at least, and the assistant reads the
        # target's last two: the last sliding-window one and the last full-attention one
        if self.n_layer < 2 or self.assistant_n_layer < 2:
            raise UserError("tiny-gemma4: the target and the assistant need 2 layers at least "
                            "(a sliding-window one and a full-attention one)")
        if self.assistant_n_embd == self.n_embd:
            raise UserError("tiny-gemma4: assistant_n_embd must differ from n_embd (upstream's loader "
                            "requires the assistant's embedding_length_out to differ from its embedding_length)")
        if self.n_head % self.n_head_kv or self.assistant_n_head % self.n_head_kv:
            raise UserError("tiny-gemma4: n_head and assistant_n_head must be multiples of n_head_kv")

    @property
    def tag(self) -> str:
        return (f"L{self.n_layer}-E{self.n_embd}-H{self.n_head}-KV{self.n_head_kv}-D{self.head_dim}"
                f"-F{self.n_ff}-W{self.n_swa}-C{self.n_ctx}-AL{self.assistant_n_layer}-AE{self.assistant_n_embd}"
                f"-AH{self.assistant_n_head}-AF{self.assistant_n_ff}-S{self.seed}")


@dataclass(frozen=True)
class TinyGemma4Pair:
    target: Path      # -m
    assistant: Path   # -md, with --spec-type draft-mtp


def _swa_pattern(n_layer: int) -> list[bool]:
    """True for a sliding-window layer: every layer but the last, so the last two are the
    sliding-window and full-attention layers the assistant shares."""
    return [il != n_layer - 1 for il in range(n_layer)]


def _add_common_keys(w: Any, shape: TinyGemma4Shape, n_layer: int, n_embd: int, n_head: int, n_ff: int) -> None:
    """Keys the target and the assistant both carry; the attention geometry is the target's in both."""
    add_decoder_geometry(w, n_ctx=shape.n_ctx, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
                         n_head_kv=shape.n_head_kv, head_dim=shape.head_dim)
    w.add_key_length_swa(shape.head_dim)
    w.add_value_length_swa(shape.head_dim)
    w.add_sliding_window(shape.n_swa)
    w.add_sliding_window_pattern(_swa_pattern(n_layer))
    w.add_rope_freq_base(ROPE_FREQ_BASE)
    w.add_rope_freq_base_swa(ROPE_FREQ_BASE_SWA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_file_type(0)  # all f32


@dataclass(frozen=True)
class _Tensors:
    """Adds weights to a GGUF under gguf-py's names for upstream's tensors (MODEL_TENSOR members)."""
    gguf: ModuleType
    writer: Any

    def add(self, tensor: str, data: np.ndarray, il: int | None = None) -> None:
        name = self.gguf.TENSOR_NAMES[self.gguf.MODEL_TENSOR[tensor]].format(bid=il)
        self.writer.add_tensor(name + ".weight", data)

    def finish(self) -> None:
        self.writer.write_header_to_file()
        self.writer.write_kv_data_to_file()
        self.writer.write_tensors_to_file()
        self.writer.close()


def _add_ffn(t: _Tensors, weights: RandomWeights, il: int, n_embd: int, n_ff: int) -> None:
    """A Gemma feed-forward block with its pre- and post-norms."""
    t.add("FFN_NORM", weights.norm(n_embd), il)
    t.add("FFN_GATE", weights.mat(n_ff, n_embd), il)
    t.add("FFN_UP", weights.mat(n_ff, n_embd), il)
    t.add("FFN_DOWN", weights.mat(n_embd, n_ff), il)
    t.add("FFN_POST_NORM", weights.norm(n_embd), il)


def write_target(path: Path, shape: TinyGemma4Shape = TinyGemma4Shape()) -> Path:
    shape.validate()
    gguf = gguf_module()
    weights = RandomWeights(np.random.default_rng([shape.seed, 0]))
    tokens, types, merges = byte_vocab()

    w = gguf.GGUFWriter(str(path), TARGET_ARCH)
    w.add_name(f"tiny-gemma4 {shape.tag}")
    _add_common_keys(w, shape, shape.n_layer, shape.n_embd, shape.n_head, shape.n_ff)
    w.add_embedding_length_per_layer_input(0)  # a required key; 0: no per-layer embeddings
    add_byte_vocab(w, tokens, types, merges)

    t = _Tensors(gguf, w)
    q_dim, kv_dim = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    # the output projection is tied to the token embeddings (no output.weight), as in Gemma 4
    t.add("TOKEN_EMBD", weights.mat(len(tokens), shape.n_embd, 1.0))
    t.add("OUTPUT_NORM", weights.norm(shape.n_embd))
    # the full-attention layers' RoPE frequency factors: 1 rotates every dimension
    t.add("ROPE_FREQS", np.ones(shape.head_dim // 2, np.float32))
    for il in range(shape.n_layer):
        t.add("ATTN_NORM", weights.norm(shape.n_embd), il)
        t.add("ATTN_Q", weights.mat(q_dim, shape.n_embd), il)
        t.add("ATTN_K", weights.mat(kv_dim, shape.n_embd), il)
        t.add("ATTN_V", weights.mat(kv_dim, shape.n_embd), il)
        t.add("ATTN_Q_NORM", weights.norm(shape.head_dim), il)
        t.add("ATTN_K_NORM", weights.norm(shape.head_dim), il)
        t.add("ATTN_OUT", weights.mat(shape.n_embd, q_dim), il)
        t.add("ATTN_POST_NORM", weights.norm(shape.n_embd), il)
        _add_ffn(t, weights, il, shape.n_embd, shape.n_ff)
    t.finish()
    return path


def write_assistant(path: Path, shape: TinyGemma4Shape = TinyGemma4Shape()) -> Path:
    shape.validate()
    gguf = gguf_module()
    weights = RandomWeights(np.random.default_rng([shape.seed, 1]))
    tokens, types, merges = byte_vocab()
    n_embd, n_backbone = shape.assistant_n_embd, shape.n_embd

    w = gguf.GGUFWriter(str(path), ASSISTANT_ARCH)
    w.add_name(f"tiny-gemma4-assistant {shape.tag}")
    _add_common_keys(w, shape, shape.assistant_n_layer, n_embd, shape.assistant_n_head, shape.assistant_n_ff)
    w.add_embedding_length_out(n_backbone)
    # every layer is a draft layer: the model has no trunk of its own
    w.add_nextn_predict_layers(shape.assistant_n_layer)
    add_byte_vocab(w, tokens, types, merges)

    t = _Tensors(gguf, w)
    q_dim = shape.assistant_n_head * shape.head_dim
    t.add("TOKEN_EMBD", weights.mat(len(tokens), n_embd, 1.0))
    t.add("OUTPUT_NORM", weights.norm(n_embd))
    t.add("ROPE_FREQS", np.ones(shape.head_dim // 2, np.float32))
    # in: the target's token embedding beside its hidden state; out: the next hidden state
    t.add("NEXTN_PROJ_PRE", weights.mat(n_embd, 2 * n_backbone))
    t.add("NEXTN_PROJ_POST", weights.mat(n_backbone, n_embd))
    for il in range(shape.assistant_n_layer):
        # queries only: the keys and values are the target's, read from its cache
        t.add("ATTN_NORM", weights.norm(n_embd), il)
        t.add("ATTN_Q", weights.mat(q_dim, n_embd), il)
        t.add("ATTN_Q_NORM", weights.norm(shape.head_dim), il)
        t.add("ATTN_OUT", weights.mat(n_embd, q_dim), il)
        t.add("ATTN_POST_NORM", weights.norm(n_embd), il)
        t.add("LAYER_OUT_SCALE", np.ones(1, np.float32), il)
        _add_ffn(t, weights, il, n_embd, shape.assistant_n_ff)
    t.finish()
    return path


def write_pair(directory: Path, shape: TinyGemma4Shape = TinyGemma4Shape()) -> TinyGemma4Pair:
    return TinyGemma4Pair(target=write_target(directory / f"tiny-gemma4-{shape.tag}.gguf", shape),
                          assistant=write_assistant(directory / f"tiny-gemma4-assistant-{shape.tag}.gguf", shape))


def write_cached(shape: TinyGemma4Shape = TinyGemma4Shape()) -> TinyGemma4Pair:
    """The pair for `shape` in the models cache, each file written once."""
    return TinyGemma4Pair(
        target=cached(f"tiny-gemma4-{shape.tag}.gguf", lambda path: write_target(path, shape)),
        assistant=cached(f"tiny-gemma4-assistant-{shape.tag}.gguf", lambda path: write_assistant(path, shape)))
