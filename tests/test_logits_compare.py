"""logitsdump.compare: skipping the leading rows (the prefill's, SCSA's calibration steps)."""

import numpy as np
import pytest

from llama_sparse.gates.logitsdump import LogitsDump, compare


def dump(logits: np.ndarray) -> LogitsDump:
    return LogitsDump(n_prompt=4, tokens=logits.argmax(-1).astype(np.int32), logits=logits.astype(np.float32),
                      raw=logits.astype(np.float32).tobytes())


def test_skipped_rows_do_not_count() -> None:
    ref = np.zeros((6, 5))
    ref[:, 1] = 3.0
    other = ref.copy()
    other[0, 4] = 9.0            # the first row disagrees
    assert compare(dump(ref), dump(other))["top1"] == pytest.approx(5 / 6)
    m = compare(dump(ref), dump(other), skip=1)
    assert (m["steps"], m["top1"], m["diff_steps"], m["kl_max"]) == (5, 1.0, 0, 0.0)


def test_skipping_everything_is_an_error() -> None:
    ref = dump(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="leaves none of the 3 rows"):
        compare(ref, ref, skip=3)
