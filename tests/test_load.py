"""Reliability under load: 8 clients against a --parallel 4 server, dense and sparse in one run.

The full gate (gates/load.yaml, a few hundred requests) is run by hand for the figures; CI runs
a smaller one (24 requests an arm: three rounds of the 8 clients over the 4 slots). A server
killed in the middle is an error of that arm, with what was measured until then kept on disk.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from llama_sparse.gates import spec as specs
from llama_sparse.gates.runner import run_gate
from llama_sparse.progress import Progress

pytestmark = pytest.mark.slow

LOAD_GATE = """
kind: load
models: [smollm2-135m]
context_lengths: [768]
samples: 4
batch: [4]
clients: 8
requests: {requests}
n_predict: 16
time_limit: 600
arms:
  - dense
  - name: sparse-0.25
    flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-coverage, "0.25"]
"""


def gate(tmp_path: Path, text: str):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return run_gate(specs.load(path), tmp_path / "results", progress=Progress(plain=True))


def children_named(name: str) -> list[int]:
    """Pids of this process's children called `name` (from /proc, no psutil needed)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == os.getpid() and comm == name[:15]:
            pids.append(int(entry.name))
    return pids


def test_load_no_failures_and_no_needle_lost(tmp_path: Path) -> None:
    ctx = gate(tmp_path, LOAD_GATE.format(requests=24))
    assert len(ctx.report.results) == 2
    for r in ctx.report.results:
        assert r.error is None, r.error
        m = r.metrics
        assert m["requests"] == 24 and m["not_sent"] == 0
        assert m["http_5xx"] == 0 and m["http_other_errors"] == 0 and m["parse_errors"] == 0
        assert m["timing_lines_missing"] == 0
        assert m["lost_under_load"] == 0
        assert 0.0 <= m["same_answer_share"] <= 1.0
        assert r.passed is True
    assert ctx.report.verdict() is True
    # the sparse arm really decoded sparse under load
    logs = list((ctx.out_dir / "logs").glob("load-sparse-0.25-*.log"))
    assert logs and "sparse attention: decode read" in logs[0].read_text()


def test_server_killed_mid_load_is_an_arm_error_with_partial_results_kept(tmp_path: Path) -> None:
    killed: list[int] = []

    def killer() -> None:
        # wait until the load phase of the first arm has answered a few requests, then kill -9
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            logs = list((tmp_path / "results").glob("*/logs/load-dense-*.log"))
            text = logs[0].read_text(errors="replace") if logs else ""
            if text.count("total time =") >= 4 + 3:   # 4 alone + 3 under load
                # the server logs a request's timings before its response reaches the client:
                # give the clients time to record the answers, so that the kill is under load
                time.sleep(1.0)
                for pid in children_named("llama-server"):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)

    watcher = threading.Thread(target=killer, daemon=True)
    watcher.start()
    ctx = gate(tmp_path, LOAD_GATE.format(requests=200))
    watcher.join(timeout=5)
    assert killed, "the server was never killed"
    dense, sparse = ctx.report.results
    assert dense.error and "died under load" in dense.error and "exited with code -9" in dense.error
    assert dense.metrics == {} and dense.passed is False
    assert sparse.error is None and sparse.passed is True        # the next arm still ran
    data = json.loads((ctx.out_dir / "report.json").read_text())
    kept = data["results"][0]["samples"]
    assert len(kept) >= 3 and all(r["status"] == 200 for r in kept)   # answered before the kill, kept
    assert data["results"][0]["metrics"] == {}                          # never a score
    assert "ERROR" in (ctx.out_dir / "report.md").read_text()
