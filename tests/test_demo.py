"""The demo runs `--sparse-attn on` as a user types it, with the coverage the build's help names."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    per_score = HELP.replace("(default: 0.625)", "(a number in (0, 1]; default: 0.5 with the key sketch, 0.625 with the key bounds)")
    arm = default_sparse_arm("--sparse-attn off|on|auto\n" + per_score)
    assert arm is not None and arm.coverage == 0.5


def test_a_build_without_sparse_flags_has_no_sparse_arm() -> None:
    assert default_sparse_arm("-m, --model FNAME  model path\n") is None


def test_the_quick_plan_answers_prose_and_times_8k() -> None:
    from llama_sparse.demo import FULL, QUICK

    assert QUICK.tasks == ("niah_multikey_1",) and QUICK.needle_contexts == (7936,) == QUICK.speed_contexts
    assert QUICK.repeats >= 5
    # each needle prompt prefilled once, the speed prompt by each arm
    assert QUICK.prefill_tokens(2) == 4 * 7936 + 2 * 7936
    assert FULL.prefill_tokens(2) == 8 * 2 * (4096 + 7936) + 2 * (4096 + 7936)


def test_time_left_is_the_prefill_rate_so_far(monkeypatch) -> None:
    from llama_sparse import demo

    now = [0.0]
    monkeypatch.setattr(demo.time, "monotonic", lambda: now[0])
    clock = demo.TimeLeft(total_tokens=6000)
    now[0] = 120.0
    assert clock.advance(2000) == "2.0 min so far, about 4 min left"


@pytest.mark.slow
def test_demo_runs_needles_once_prefilled_and_the_speed_ab(tmp_path: Path, tiny_qwen3: Path) -> None:
    from llama_sparse import demo

    # past --sparse-attn on's minimum of 4096 visible rows, where the demo's 8K is
    plan = demo.DemoPlan(needle_contexts=(4608,), tasks=("niah_multikey_1",), samples=2, speed_contexts=(4608,))
    run = demo.run(tmp_path, model=str(tiny_qwen3), plan=plan)
    ctx = run.ctx
    by = {(r.arm, "niah" in r.metrics): r for r in ctx.report.results}
    assert set(by) == {("dense", True), ("sparse-default", True), ("dense", False), ("sparse-default", False)}
    for arm in ("dense", "sparse-default"):
        needles, speed = by[(arm, True)], by[(arm, False)]
        assert needles.error is None and speed.error is None, (needles.error, speed.error)
        # answered from the restored prefill: only the prompt's last token evaluated again
        assert [x["prompt_evaluated"] for x in needles.samples] == [1, 1]
        assert speed.metrics["repeats"] == 5
    assert "lost_vs_reference" in by[("sparse-default", True)].metrics
    assert "ratio_median" in by[("sparse-default", False)].metrics
    report_md = (ctx.out_dir / "report.md").read_text()
    assert "## Needle by needle" in report_md and (ctx.out_dir / "report.json").is_file()
    table = run.summary().splitlines()
    assert table[0] == "| arm | needles at 4.5K | decode at 4.5K | KV blocks read | steps computed again |"
    dense_row, sparse_row = table[2].split(" | "), table[3].split(" | ")
    assert dense_row[1] == f"{sum(x['score'] == 1.0 for x in by[('dense', True)].samples)} of 2"
    assert sparse_row[1].endswith(" lost)") and sparse_row[2].endswith("x)") and sparse_row[3].endswith("%")
