"""The niah gate's calibration step against stand-in servers: an arm that does not calibrate
answers no calibration question, and an SCSA arm's "taus frozen" line is waited for (the server
logs it after it has sent the answer), but its absence is still an error."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from llama_sparse.errors import UserError
from llama_sparse.gates import needles
from llama_sparse.gates.niah import NiahSample
from llama_sparse.gates.spec import Arm
from llama_sparse.server import ServerProcess

SAMPLE = NiahSample(task="niah_single_1", index=0, depth=0.5, context_tokens=128, prompt="p", key="k",
                    values=("1234567",), distractor_keys=())
SCSA = Arm(name="scsa", flags=("--sparse-attn", "scsa"), sparse=True)
FROZEN = "slot print_timing: id  0 | task 0 | scsa: decode read 30.0% of the visible rows; calibration 32 steps, taus frozen\n"


class StandInServer:
    """Answers at once; writes its SCSA line `delay` seconds later, or never (delay None)."""

    def __init__(self, log_path: Path, delay: float | None) -> None:
        self.log_path = log_path
        self.delay = delay
        self.requests = 0
        log_path.write_text("listening\n")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    # the log is read as the real server's is
    read_log = ServerProcess.read_log
    wait_log_until = ServerProcess.wait_log_until

    def log_tail(self) -> str:
        return self.log_path.read_text()[-500:]

    def complete(self, prompt, n_predict, ignore_eos=False) -> dict:
        self.requests += 1
        if self.delay is not None:
            threading.Timer(self.delay, lambda: self.log_path.open("a").write(FROZEN)).start()
        return {"content": "1234567."}


def test_an_arm_that_does_not_calibrate_answers_no_calibration_question(tmp_path: Path) -> None:
    server = StandInServer(tmp_path / "dense.log", None)
    assert needles.calibrate(server, Arm(name="dense"), [SAMPLE], 32) == []
    assert server.requests == 0


def test_scsa_line_written_after_the_answer_is_waited_for(tmp_path: Path) -> None:
    server = StandInServer(tmp_path / "scsa.log", 0.5)
    records = needles.calibrate(server, SCSA, [SAMPLE], 32)
    assert server.requests == 1 and len(records) == 1 and records[0]["score"] == 1.0


def test_scsa_never_frozen_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(needles, "CALIBRATION_LOG_WAIT_S", 0.5)
    server = StandInServer(tmp_path / "scsa.log", None)
    with pytest.raises(UserError, match="taus are not frozen after the 1 calibration"):
        needles.calibrate(server, SCSA, [SAMPLE], 32)
