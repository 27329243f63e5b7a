"""The niah gate's calibration step against stand-in servers: an arm that does not calibrate
answers no calibration question; an SCSA arm is calibrated when its last calibration response's
`timings.sparse` says so, passes where the context is too short to calibrate on (every row read
exactly, as the scored answers will be), and is an error otherwise."""

from __future__ import annotations


import pytest

from llama_sparse.errors import UserError
from llama_sparse.gates import needles
from llama_sparse.gates.niah import NiahSample
from llama_sparse.gates.spec import Arm

SAMPLE = NiahSample(task="niah_single_1", index=0, depth=0.5, context_tokens=128, prompt="p", key="k",
                    values=("1234567",), distractor_keys=())
SCSA = Arm(name="scsa", flags=("--sparse-attn", "scsa"), sparse=True)

CALIBRATED = {"method": "scsa", "calibrated": True, "calibration_steps": 32, "rows_read": 300, "rows_visible": 1000}
TOO_SHORT = {"method": "scsa", "calibrated": False, "calibration_steps": 0, "rows_read": 1000, "rows_visible": 1000}
CALIBRATING = {"method": "scsa", "calibrated": False, "calibration_steps": 20, "rows_read": 1000, "rows_visible": 1000}


class StandInServer:
    """Answers at once, with the SCSA figures it is given in its response's timings."""

    def __init__(self, sparse: dict | None) -> None:
        self.sparse = sparse
        self.requests = 0

    def log_tail(self) -> str:
        return "(the stand-in's log)"

    def complete(self, prompt, n_predict, ignore_eos=False) -> dict:
        self.requests += 1
        return {"content": "1234567.", "timings": {"predicted_n": n_predict, **({"sparse": self.sparse} if self.sparse else {})}}


def test_an_arm_that_does_not_calibrate_answers_no_calibration_question() -> None:
    server = StandInServer(None)
    assert needles.calibrate(server, Arm(name="dense"), [SAMPLE], 32) == []
    assert server.requests == 0


def test_scsa_calibrated_by_its_response() -> None:
    server = StandInServer(CALIBRATED)
    records = needles.calibrate(server, SCSA, [SAMPLE], 32)
    assert server.requests == 1 and len(records) == 1 and records[0]["score"] == 1.0 and "scsa" not in records[0]


def test_scsa_with_nothing_to_calibrate_on_reads_exactly_and_says_so() -> None:
    records = needles.calibrate(StandInServer(TOO_SHORT), SCSA, [SAMPLE], 32)
    assert records[0]["scsa"].startswith("nothing sealed to calibrate on")


def test_scsa_still_calibrating_is_an_error() -> None:
    with pytest.raises(UserError, match="taus are not frozen after the 1 calibration"):
        needles.calibrate(StandInServer(CALIBRATING), SCSA, [SAMPLE], 32)
