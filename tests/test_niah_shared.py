"""niah's shared prefill (needles.answer_shared) against stand-in servers: what happens when an arm
dies or does not reuse the restored slot. No build needed; the real servers are in
tests/test_gates_run.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llama_sparse.server import ServerError
from llama_sparse.gates import needles, niah
from llama_sparse.gates.runner import GateContext
from llama_sparse.gates.spec import load
from llama_sparse.progress import Progress
from llama_sparse.server import ServerConfig


PROMPT_N = 600  # what a completion evaluates without a restored slot


class FakeServer:
    """Answers every prompt with the needle's value; `fail_at` (completion number) raises as a dead
    server would; `reused_n` is what the timings say was evaluated after a restore (PROMPT_N
    without one). `calls` records the requests in order."""

    def __init__(self, name: str, fail_at: int | None, reused_n: int) -> None:
        self.name, self.fail_at, self.reused_n, self.answers = name, fail_at, reused_n, 0
        self.restored, self.calls = False, []

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def request(self, method: str, path: str, **kw) -> dict:
        self.calls.append(path.split("action=")[-1])
        self.restored = self.restored or path.endswith("action=restore")
        return {}

    def complete(self, prompt: str, n_predict: int = 32, **params) -> dict:
        if self.fail_at is not None and self.answers == self.fail_at:
            raise ServerError(f"llama-server {self.name} exited with code -9 during POST /completion")
        self.answers += 1
        self.calls.append(f"complete {n_predict}")
        evaluated, self.restored = (self.reused_n if self.restored else PROMPT_N), False
        return {"content": prompt[-20:], "timings": {"prompt_n": evaluated}}


def run_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, behaviour: dict[str, tuple[int | None, int]],
               configs: list[ServerConfig] | None = None, servers: list[FakeServer] | None = None):
    configs = [] if configs is None else configs
    servers = [] if servers is None else servers

    def start(cfg: ServerConfig, log: Path) -> FakeServer:
        configs.append(cfg)
        servers.append(FakeServer(cfg.model.name, *behaviour[cfg.model.name]))
        return servers[-1]

    gate = tmp_path / "g.yaml"
    gate.write_text("kind: niah\nmodels: [tiny-qwen3]\ncontext_lengths: [1024]\nsamples: 3\n"
                    "tasks: [niah_single_2]\nshared_prefill: true\narms: [dense, {name: sparse, flags: []}]\n")
    with Progress(plain=True) as progress:
        ctx = GateContext(load(gate), tmp_path / "out", progress)
        ctx.out_dir.mkdir()
        monkeypatch.setattr(ctx, "server_config", lambda arm, *a, **k: ServerConfig(model=Path(arm.name)))
        monkeypatch.setattr(needles, "ServerProcess", start)
        samples = niah.generate("niah_single_2", 600, 3, 0, lambda t: len(t.split()))
        return ctx, needles.answer_shared(ctx, ctx.arms, "tiny-qwen3", 1024, "f16", 8, samples)


def test_every_arm_answers_every_prompt_and_the_report_holds_each_once(tmp_path, monkeypatch) -> None:
    ctx, (dense, sparse) = run_shared(tmp_path, monkeypatch, {"dense": (None, 1), "sparse": (None, 1)})
    assert dense.error is None and sparse.error is None
    assert len(dense.samples) == len(sparse.samples) == 3 and sparse.metrics["samples"] == 3.0
    saved = json.loads((ctx.out_dir / "report.json").read_text())
    assert [r["arm"] for r in saved["results"]] == ["dense", "sparse"]


def test_the_reference_answers_from_the_restored_slot_as_every_arm_does(tmp_path, monkeypatch) -> None:
    """The first arm prefills (one token), saves, then restores and answers like the others: an
    answer from its own prefill would compute the last prompt token inside a batch where the
    others compute it alone, and on Gemma 3 at 16K that rounding alone moved needles."""
    servers: list[FakeServer] = []
    _, (dense, sparse) = run_shared(tmp_path, monkeypatch, {"dense": (None, 1), "sparse": (None, 1)}, servers=servers)
    assert dense.error is None and sparse.error is None
    assert servers[0].calls == ["complete 1", "save", "restore", "complete 8"] * 3
    assert servers[1].calls == ["restore", "complete 8"] * 3
    assert [x["prompt_evaluated"] for x in dense.samples + sparse.samples] == [1] * 6


def test_every_arm_keeps_a_full_sliding_window_cache(tmp_path, monkeypatch) -> None:
    """A restored slot of a sliding-window model (Gemma 3) can reuse the prompt only when the SWA
    layers kept more than the last window (llama-server re-prefills otherwise: 16377 tokens per
    sample at 16K, and the gate stops every arm but the first)."""
    configs: list[ServerConfig] = []
    run_shared(tmp_path, monkeypatch, {"dense": (None, 1), "sparse": (None, 1)}, configs)
    assert [c.model.name for c in configs] == ["dense", "sparse"]
    assert all("--swa-full" in c.extra_args and "--slot-save-path" in c.extra_args for c in configs)


def test_when_the_first_arm_dies_the_others_stop_as_errors_keeping_their_answers(tmp_path, monkeypatch) -> None:
    # the third completion: the second prompt's prefill
    ctx, (dense, sparse) = run_shared(tmp_path, monkeypatch, {"dense": (2, 1), "sparse": (None, 1)})
    assert "exited with code -9" in dense.error and len(dense.samples) == 1
    assert "stopped with the first arm (dense)" in sparse.error and len(sparse.samples) == 1
    assert dense.metrics == sparse.metrics == {}  # an error is never a score
    saved = json.loads((ctx.out_dir / "report.json").read_text())
    assert [len(r["samples"]) for r in saved["results"]] == [1, 1]


def test_an_arm_that_evaluates_the_whole_prompt_again_is_an_error(tmp_path, monkeypatch) -> None:
    _, (dense, sparse) = run_shared(tmp_path, monkeypatch, {"dense": (None, 1), "sparse": (None, PROMPT_N)})
    assert dense.error is None and len(dense.samples) == 3
    assert "the restored prefill was not reused (600 prompt tokens evaluated)" in sparse.error


def test_a_gate_that_cannot_run_stops_instead_of_failing_an_arm(tmp_path, monkeypatch) -> None:
    """No build is not an arm's failure: the UserError stops the gate with its message (a server
    that dies, above, is an ArmError and only that arm's error)."""
    from llama_sparse.errors import ArmError, UserError

    def no_build(arm, *a, **k):
        raise UserError("no patched build found; run `llama-sparse build`")

    gate = tmp_path / "g.yaml"
    gate.write_text("kind: niah\nmodels: [tiny-qwen3]\ncontext_lengths: [1024]\nsamples: 1\n"
                    "tasks: [niah_single_2]\narms: [dense]\n")
    with Progress(plain=True) as progress:
        ctx = GateContext(load(gate), tmp_path / "out", progress)
        monkeypatch.setattr(ctx, "server_config", no_build)
        samples = niah.generate("niah_single_2", 600, 1, 0, lambda t: len(t.split()))
        with pytest.raises(UserError, match="no patched build found") as raised:
            needles.answer(ctx, ctx.arms[0], "tiny-qwen3", 1024, "f16", 8, samples)
        assert not isinstance(raised.value, ArmError)
        with pytest.raises(UserError, match="no patched build found"):
            needles.answer_shared(ctx, ctx.arms, "tiny-qwen3", 1024, "f16", 8, samples)
