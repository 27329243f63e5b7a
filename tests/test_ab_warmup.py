"""The ab gate's first round for an SCSA arm runs its calibration window, so that the timed
repeats measure the calibrated operator and not its exact first steps."""

from llama_sparse.gates.ab import warmup_tokens
from llama_sparse.gates.flags import SCSA_CALIB_STEPS
from llama_sparse.gates.schema import Arm


def test_dense_and_quest_arms_prefill_only() -> None:
    assert warmup_tokens(Arm("dense")) == 1
    assert warmup_tokens(Arm("q", flags=("--sparse-attn", "on", "--sparse-attn-coverage", "0.25"))) == 1


def test_scsa_arm_decodes_its_calibration_window() -> None:
    assert warmup_tokens(Arm("s", flags=("--sparse-attn", "scsa"))) == 1 + SCSA_CALIB_STEPS
    assert warmup_tokens(Arm("s", flags=("--sparse-attn", "scsa", "--scsa-calib-steps", "8"))) == 9
    assert warmup_tokens(Arm("s", flags=("--sparse-attn=scsa", "--scsa-calib-steps=0"))) == 1


def test_scsa_arm_with_loaded_taus_does_not_calibrate() -> None:
    assert warmup_tokens(Arm("s", flags=("--sparse-attn", "scsa", "--scsa-taus", "t.json"))) == 1
