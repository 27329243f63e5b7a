"""tiny-qwen3: a Qwen3-architecture GGUF with random weights, written by our own code.

It has the real Qwen3 graph (QK-norm, GQA, RoPE, SwiGLU) at any shape and a byte-level BPE
vocabulary, so plumbing and byte-identity tests run in seconds without a download. Same shape
and seed give the same file, byte for byte. We write it with the gguf-py of the pinned
upstream tree when it is there (its writer matches its loader exactly), else the `gguf` package.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from llama_sparse.errors import UserError
from llama_sparse.project import Project, models_dir


def require_positive(shape, model: str) -> None:
    """Every field of a tiny model's shape but its seed must be positive."""
    for k, v in asdict(shape).items():
        if v <= 0 and k != "seed":
            raise UserError(f"{model}: {k} must be positive, got {v}")


@dataclass(frozen=True)
class TinyQwen3Shape:
    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 8
    n_head_kv: int = 2
    head_dim: int = 64
    n_ff: int = 512
    n_ctx: int = 8192
    seed: int = 1234

    def validate(self) -> None:
        require_positive(self, "tiny-qwen3")
        if self.n_head % self.n_head_kv:
            raise UserError(f"tiny-qwen3: n_head ({self.n_head}) must be a multiple of n_head_kv ({self.n_head_kv})")

    @property
    def tag(self) -> str:
        return (f"L{self.n_layer}-E{self.n_embd}-H{self.n_head}-KV{self.n_head_kv}-D{self.head_dim}"
                f"-F{self.n_ff}-C{self.n_ctx}-S{self.seed}")


def gguf_module():
    """The pinned tree's gguf-py if it is vendored, else the installed `gguf` package."""
    try:
        vendored = Project.find().vendor_dir / "gguf-py"
    except UserError:
        vendored = None
    if vendored and (vendored / "gguf" / "__init__.py").is_file():
        sys.path.insert(0, str(vendored))
        try:
            for name in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
                del sys.modules[name]
            return importlib.import_module("gguf")
        finally:
            sys.path.remove(str(vendored))
    return importlib.import_module("gguf")


def byte_vocab() -> tuple[list[str], list[int], list[str]]:
    """GPT-2 byte-level BPE: 256 byte symbols, a few merges, the Qwen chat specials."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_chars = {b: chr(c) for b, c in zip(bs, cs)}
    tokens = [byte_chars[b] for b in range(256)]
    space = byte_chars[ord(" ")]
    merges = []
    for word in ("the", "he", "in", "an", "er", "on", "is", "re", "at", "en"):
        a, b = word[0], word[1:]
        if a + b not in tokens and len(b) == 1:
            merges.append(f"{a} {b}")
            tokens.append(a + b)
    for ch in "tsaiowcbpmfdhl":
        merges.append(f"{space} {ch}")
        tokens.append(space + ch)
    types = [1] * len(tokens)  # normal
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tokens.append(special)
        types.append(3)  # control
    return tokens, types, merges


def add_byte_vocab(w, tokens: list[str], types: list[int], merges: list[str]) -> None:
    """The byte-level BPE vocabulary of byte_vocab() into a GGUF writer (our tiny test models share it)."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)


@dataclass(frozen=True)
class RandomWeights:
    """f32 weights drawn from one generator in call order: the same calls give the same bytes."""
    rng: np.random.Generator

    def mat(self, rows: int, cols: int, scale: float | None = None) -> np.ndarray:
        """A (rows, cols) matrix, scaled by 1/sqrt(cols) unless told (activations keep their size)."""
        s = scale if scale is not None else 1.0 / np.sqrt(cols)
        return (self.rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        """RMS-norm weights near 1."""
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)


def add_decoder_geometry(w, *, n_ctx: int, n_embd: int, n_layer: int, n_ff: int, n_head: int, n_head_kv: int,
                         head_dim: int) -> None:
    """The keys every tiny decoder writes first, in this order (the file's bytes, and so the
    cache's digest, follow the order)."""
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)


def write(path: Path, shape: TinyQwen3Shape = TinyQwen3Shape()) -> Path:
    shape.validate()
    gguf = gguf_module()
    weights = RandomWeights(np.random.default_rng(shape.seed))
    mat, norm = weights.mat, weights.norm
    tokens, types, merges = byte_vocab()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_name(f"tiny-qwen3 {shape.tag}")
    add_decoder_geometry(w, n_ctx=shape.n_ctx, n_embd=shape.n_embd, n_layer=shape.n_layer, n_ff=shape.n_ff,
                         n_head=shape.n_head, n_head_kv=shape.n_head_kv, head_dim=shape.head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(0)  # all f32
    add_byte_vocab(w, tokens, types, merges)

    q_dim, kv_dim = shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    w.add_tensor("token_embd.weight", mat(n_vocab, shape.n_embd, 1.0))
    for i in range(shape.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(shape.n_embd))
        w.add_tensor(p + "attn_q.weight", mat(q_dim, shape.n_embd))
        w.add_tensor(p + "attn_k.weight", mat(kv_dim, shape.n_embd))
        w.add_tensor(p + "attn_v.weight", mat(kv_dim, shape.n_embd))
        w.add_tensor(p + "attn_q_norm.weight", norm(shape.head_dim))
        w.add_tensor(p + "attn_k_norm.weight", norm(shape.head_dim))
        w.add_tensor(p + "attn_output.weight", mat(shape.n_embd, q_dim))
        w.add_tensor(p + "ffn_norm.weight", norm(shape.n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(shape.n_embd, shape.n_ff))
    w.add_tensor("output_norm.weight", norm(shape.n_embd))
    w.add_tensor("output.weight", mat(n_vocab, shape.n_embd))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def cached(name: str, write_to: Callable[[Path], object]) -> Path:
    """The file `name` in the models cache, written once by `write_to(path)` (atomically: a
    process that stops half-way leaves no file under that name)."""
    out = models_dir() / name
    if out.is_file():
        return out
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    try:
        write_to(tmp)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def write_cached(shape: TinyQwen3Shape = TinyQwen3Shape()) -> Path:
    """The model for `shape` in the models cache, written once."""
    return cached(f"tiny-qwen3-{shape.tag}.gguf", lambda path: write(path, shape))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
