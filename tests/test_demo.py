"""The demo runs `--sparse-attn on` as a user types it, with the coverage the build's help names."""

from __future__ import annotations

from llama_sparse.demo import default_sparse_arm

HELP = """
--sparse-attn-topk N                    KV blocks read per query row and KV head (default: use
                                        --sparse-attn-coverage)
--sparse-attn-coverage F                fraction of the visible KV blocks read, in (0, 1] (default: 0.625)
                                        (env: LLAMA_ARG_SPARSE_ATTN_COVERAGE)
"""


def test_the_default_arm_takes_the_coverage_from_the_help() -> None:
    arm = default_sparse_arm("--sparse-attn off|on|auto\n" + HELP)
    assert arm is not None and arm.flags == ("--sparse-attn", "on") and arm.sparse
    assert arm.coverage == 0.625
    assert default_sparse_arm(HELP.replace("0.625", "0.3")).coverage == 0.3


def test_a_coverage_per_score_gives_the_cpu_one() -> None:
    per_score = HELP.replace("(default: 0.625)", "(a number in (0, 1]; default: 0.25 with the key sketch, 0.625 with the key bounds)")
    arm = default_sparse_arm("--sparse-attn off|on|auto\n" + per_score)
    assert arm is not None and arm.coverage == 0.25


def test_a_build_without_sparse_flags_has_no_sparse_arm() -> None:
    assert default_sparse_arm("-m, --model FNAME  model path\n") is None
