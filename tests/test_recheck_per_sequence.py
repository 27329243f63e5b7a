"""The recheck decides per sequence: a sequence's step is taken back and computed again densely
only when its own next tokens are in doubt, never because another sequence in the same batch was.

Two sequences with a KV stream each decode the same teacher-forced tokens, first each alone, then
side by side in one batch. Before: a batch was taken back whole when any of its rows was thin, so
beside each other the sequences were computed again 16 and 16 times in 24 steps where alone 11
and 12 were in doubt, and a sequence's logits moved by up to 0.26 on the steps its neighbour's
doubt made dense."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparse.binaries import lib_dir

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "recheck_alone_and_beside.py"
FOUR = Path(__file__).parent / "decode_alone_and_beside.py"


def _run(model: Path, script: Path = SCRIPT, *args: str) -> dict:
    from llama_sparse.bindings import installed_version

    assert installed_version() is not None, "llama-cpp-python: run `llama-sparse python-bindings install`"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SPARSE_") or k == "LLAMA_SPARSE_CACHE"}
    env["LLAMA_CPP_LIB_PATH"] = str(lib_dir())
    proc = subprocess.run([sys.executable, str(script), str(model), *(args or ("1500", "24"))], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_sequence_is_computed_again_when_its_own_step_is_in_doubt(tiny_qwen3: Path) -> None:
    result = _run(tiny_qwen3)
    alone, beside = result["rechecked_per_step"]["alone"], result["rechecked_per_step"]["beside"]
    # the case means something: some steps had one sequence in doubt and the other not (a random
    # model's steps are often in doubt)
    assert sum(a != b for a, b in alone) >= 4, alone
    # beside a chunk of another sequence (4 outputs a step, read densely as a prompt's) only the
    # decoding sequence is ever computed again
    assert all(b == 0 for _, b in alone[24:]) and any(a for a, _ in alone[24:]), alone[24:]
    # every sequence is computed again on exactly the steps it is alone, and counted so
    assert beside == alone
    assert result["counts"]["beside"] == result["counts"]["alone"]
    # and its logits are its own: a step made dense by its neighbour moved them by 0.2-0.26; the
    # same step beside another differs from alone only in the last bits of this model's f32 matrix
    # products for a batch of two, which its cache then carries (bit for bit on SmolLM2: below)
    assert max(max(d) for d in result["max_abs_diff"]) < 0.01, result["max_abs_diff"]


def test_a_backend_sampler_on_one_sequence_leaves_the_others_recheck_alone(tiny_qwen3: Path) -> None:
    """A sequence with a backend sampler keeps its step (its choice is made on the device); the
    other sequences of its batches keep their recheck. Before: one backend sampler in the context
    switched the recheck off for every sequence."""
    result = _run(tiny_qwen3)
    plain = [a for a, _ in result["rechecked_per_step"]["alone"]]
    sampled = result["backend_sampler"]
    # sequence 0 beside a backend-sampled sequence is computed again where it is alone without one
    assert [a for a, _ in sampled["rechecked_per_step"]["beside"]] == plain and sum(plain) > 0, sampled
    assert all(b == 0 for _, b in sampled["rechecked_per_step"]["beside"]), sampled
    assert max(sampled["max_abs_diff_seq0"]) < 0.02, sampled["max_abs_diff_seq0"]
    # and the sampled sequence's tokens are those it samples alone
    assert sampled["sampled_tokens"]["beside"] == sampled["sampled_tokens"]["alone"], sampled["sampled_tokens"]
    assert all(t >= 0 for t in sampled["sampled_tokens"]["beside"])


def test_a_caller_can_ask_for_a_rows_recheck(tiny_qwen3: Path) -> None:
    """llama_sparse_recheck_margin / llama_sparse_recheck_row, which common's sampler calls when a
    grammar's two best allowed tokens are within the margin (the recheck of the raw logits cannot
    see what a grammar allows): the row's sequence is computed again densely, the other sequence's
    logits stay bit for bit, the step is counted once and asked for no more."""
    steps = _run(tiny_qwen3)["caller"]
    sparse_steps = [s for s in steps if s["margin"] > 0]
    assert len(sparse_steps) >= 4 and all(s["margin"] in (0.0, 0.25) for s in steps), steps
    for s in steps:
        assert s["rc"] == 0 and s["margin_after"] == 0.0 and s["seq1_unchanged"], s
        # computed again: dense's logits up to a batch's last bits; a sparse row was 0.2-0.25 away
        assert s["seq0_vs_dense"] < 0.02, s
        assert s["rechecked"] == (1 if s["margin"] > 0 else 0), s
    assert max(s["seq0_moved"] for s in sparse_steps) > 0.05


def test_four_slots_decode_beside_each_other_as_each_alone(smollm2: Path) -> None:
    """What a server's slots get (a KV stream each, --no-kv-unified) on the model the gates serve:
    with the block method, a sequence decoded beside three others gets the logits it gets alone,
    bit for bit, and is computed again on the same steps; so is a prompt cut at another place
    (a server cuts one where the other slots' tokens leave room). Before, sequences computed again
    together shared a dense pass over several streams, which upstream's flash attention computes
    on another path than one stream's: their logits moved by 0.3-7 from their first step in doubt."""
    result = _run(smollm2, FOUR, "4", "1500", "12")
    again = result["again"]
    # the case means something: a step where two or more sequences were computed again at once
    assert any(sum(step) >= 2 for step in again["alone"]), again
    assert again["beside"] == again["alone"]
    assert all(d == 0.0 for diffs in result["max_abs_diff"] for d in diffs), result["max_abs_diff"]
    assert all(d == 0.0 for d in result["recut_max_abs_diff"]), result["recut_max_abs_diff"]
