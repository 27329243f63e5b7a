"""The gate runners on real builds: exact gates pass and can fail, errors are arm errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llama_sparse.gates import spec as specs
from llama_sparse.gates.needles import MAX_REUSED_TAIL
from llama_sparse.gates.runner import run_gate
from llama_sparse.progress import Progress

pytestmark = pytest.mark.slow


def gate(tmp_path: Path, text: str):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return run_gate(specs.load(path), tmp_path / "results", progress=Progress(plain=True))


def test_identity_gate_passes_patched_and_anchor_against_upstream(tmp_path: Path) -> None:
    """Sparse off, and sparse selecting every block, both decode bit for bit like upstream."""
    ctx = gate(tmp_path, """
kind: identity
models: [tiny-qwen3, smollm2-135m]
context_lengths: [1024]
samples: 2
n_predict: 8
arms:
  - {name: upstream, variant: upstream}
  - {name: patched}
  - {name: anchor, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-topk, "1048576"]}
  - name: prefill-anchor
    flags: [--sparse-prefill, "on", --sparse-attn-min-kv, "0", --sparse-prefill-coverage, "1", --sparse-prefill-tolerance, "0"]
""")
    assert ctx.report.verdict() is True
    assert [r.metrics["diff_prompts"] for r in ctx.report.results] == [0.0] * 6
    data = json.loads((ctx.out_dir / "report.json").read_text())
    assert data["builds"]["patched"]["llama_sparse"].startswith("llama-sparse")
    # the anchor arm really ran the selection (and kept every block); the off arm counted nothing
    anchor_logs = list((ctx.out_dir / "logs").glob("server-anchor-*.log"))
    assert anchor_logs and all("sparse attention: decode read 100.0% of the visible KV blocks" in p.read_text()
                               for p in anchor_logs)
    assert all("sparse attention:" not in p.read_text() for p in (ctx.out_dir / "logs").glob("server-patched-*.log"))
    # the select-all prefill arm read every prompt row's blocks through the prompt selection
    prefill_logs = list((ctx.out_dir / "logs").glob("server-prefill-anchor-*.log"))
    assert prefill_logs and all("sparse prefill: the prompt read 100.0% of the visible KV blocks" in p.read_text()
                                for p in prefill_logs)
    assert data["builds"]["upstream"]["llama_sparse"] is None


def test_identity_gate_fails_on_a_numeric_change(tmp_path: Path) -> None:
    """Flash attention off computes the same model with other kernels: not bit-identical."""
    ctx = gate(tmp_path, """
kind: identity
models: [smollm2-135m]
context_lengths: [512]
samples: 1
n_predict: 8
arms:
  - {name: fa-on}
  - {name: fa-off, flags: [-fa, "off"]}
""")
    assert ctx.report.verdict() is False
    assert ctx.report.results[0].samples[0]["logits_bit_identical"] is False


def test_logits_gate_measures_agreement(tmp_path: Path) -> None:
    ctx = gate(tmp_path, """
kind: logits
models: [smollm2-135m]
context_lengths: [1024]
samples: 16
arms:
  - dense
  - dense-again
  - {name: fa-off, flags: [-fa, "off"]}
thresholds: {max_diff_steps: 0}
""")
    same, other = ctx.report.results
    assert same.metrics["diff_steps"] == 0 and same.metrics["kl_max"] == 0 and same.passed
    assert other.metrics["diff_steps"] > 0 and not other.passed        # the exact gate can fail
    assert other.metrics["top1"] >= 0.9 and other.metrics["kl_mean"] < 0.01  # but it is the same model


def test_identity_gate_fails_when_sparse_skips_blocks(tmp_path: Path) -> None:
    """A real selection changes the logits: the anchor test above is not passing by accident."""
    ctx = gate(tmp_path, """
kind: identity
models: [smollm2-135m]
context_lengths: [2048]
samples: 1
n_predict: 8
arms:
  - {name: dense}
  - {name: sparse, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-coverage, "0.25"]}
""")
    assert ctx.report.verdict() is False
    assert ctx.report.results[0].samples[0]["logits_bit_identical"] is False


# an A/B on the tiny model; its sparse arm reads a quarter of the blocks at every length and never
# computes a step again (a random model's steps are all in doubt, and each would read every block)
AB_TINY = """
kind: ab
models: [tiny-qwen3]
context_lengths: [2048]
repeats: 5
n_predict: 16
"""
AB_SPARSE_ARM = """  - {name: sparse, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-coverage, "0.25", --sparse-attn-recheck, "0"]}
"""


def test_ab_gate_reports_ratio_and_files(tmp_path: Path) -> None:
    ctx = gate(tmp_path, AB_TINY + "arms:\n  - dense\n  - {name: dense-again}\n" + AB_SPARSE_ARM)
    dense, again, sparse = ctx.report.results
    # the server log says how much of the KV the sparse decode read: about the coverage
    assert 0.2 <= sparse.metrics["read_fraction"] <= 0.45, sparse.metrics
    assert sparse.metrics["rechecked_fraction"] == 0.0, sparse.metrics
    assert "read_fraction" not in dense.metrics
    assert sparse.metrics["bound"] > 1.0 and "bound_share" in sparse.metrics
    assert dense.metrics["ratio_median"] == 1.0
    assert 0.5 < again.metrics["ratio_median"] < 2.0
    assert again.metrics["decode_tps_min"] <= again.metrics["decode_tps_median"] <= again.metrics["decode_tps_max"]
    assert len(again.samples) == 5
    for name in ("report.json", "report.md", "plot.png"):
        assert (ctx.out_dir / name).is_file()


def test_ab_gate_with_shared_prefill_restores_the_first_arms_prompt(tmp_path: Path) -> None:
    """Only the first arm prefills; the others restore its slot and evaluate the last token or so.
    The context part of each step is measured against dense's at depth 16."""
    ctx = gate(tmp_path, AB_TINY + "shared_prefill: true\narms:\n  - dense\n" + AB_SPARSE_ARM)
    dense, sparse = ctx.report.results
    assert dense.error is None and sparse.error is None
    warm = [r["prompt_tokens_evaluated"][0] for r in (dense.samples[0], sparse.samples[0])]
    assert all(w <= MAX_REUSED_TAIL for w in warm), warm  # the timed rounds reuse the prompt too
    # the sparse server's first request evaluated one prompt token: the rest came from the slot
    sparse_log = next((ctx.out_dir / "logs").glob("ab-sparse-*.log")).read_text()
    first_eval = re.search(r"prompt eval time = .*/\s*(\d+) tokens", sparse_log)
    assert first_eval and int(first_eval.group(1)) <= MAX_REUSED_TAIL, sparse_log[-3000:]
    assert dense.metrics["context_ratio"] == 1.0 and sparse.metrics["context_ms"] > 0
    assert not list((ctx.out_dir / "slots").glob("*.bin"))  # the shared slot is removed


def test_ttft_gate_times_whole_prefills_and_select_all_prefill_is_dense(tmp_path: Path) -> None:
    """Every repeat evaluates the whole prompt; a sparse prefill that selects every block gives
    dense's tokens exactly (its attention is dense's, bit for bit), one that reads a tenth does not
    have to; dense's attention share is measured."""
    prefill = '[--sparse-prefill, "on", --sparse-attn-min-kv, "0"'
    ctx = gate(tmp_path, f"""
kind: ttft
models: [tiny-qwen3]
context_lengths: [2048]
repeats: 2
n_predict: 8
arms:
  - dense
  - {{name: select-all, flags: {prefill}, --sparse-prefill-coverage, "1", --sparse-prefill-tolerance, "0"]}}
  - {{name: tenth, flags: {prefill}, --sparse-prefill-coverage, "0.1"]}}
""")
    dense, select_all, tenth = ctx.report.results
    assert all(r.error is None for r in ctx.report.results), [r.error for r in ctx.report.results]
    for res in ctx.report.results:
        assert [s["prompt_tokens"] for s in res.samples] == [2048 - 8 - 1] * 2
        assert all(s["prompt_ms"] > 0 for s in res.samples)
    assert dense.metrics["ratio_median"] == 1.0 and 0.0 <= dense.metrics["attention_share"] < 1.0
    assert select_all.metrics["agree_tokens_min"] == 8, select_all.metrics
    assert tenth.metrics["ratio_median"] > 0 and "e2e_ratio_median" in tenth.metrics
    # what the prompts' rows read, from each response's timings: all of it, or at most a tenth
    # and the rows' own recent blocks
    assert select_all.metrics["prefill_read_fraction"] == 1.0, select_all.metrics
    assert 0.0 < tenth.metrics["prefill_read_fraction"] < 0.5, tenth.metrics
    assert "prefill_read_fraction" not in dense.metrics


def test_dead_server_is_an_arm_error_not_a_score(tmp_path: Path) -> None:
    ctx = gate(tmp_path, """
kind: niah
models: [tiny-qwen3]
context_lengths: [4096]
samples: 2
n_predict: 8
arms:
  - dense
  - {name: broken, flags: [--override-kv, "qwen3.block_count=int:99"]}
""")
    dense, broken = ctx.report.results
    assert dense.error is None and "niah" in dense.metrics
    assert broken.error and "exited with code" in broken.error and broken.metrics == {}
    assert ctx.report.verdict() is False
    data = json.loads((ctx.out_dir / "report.json").read_text())
    assert data["results"][1]["metrics"] == {} and data["results"][1]["error"]
    assert "ERROR" in (ctx.out_dir / "report.md").read_text()


@pytest.mark.parametrize("n_samples", [3])
def test_dense_smollm2_finds_every_needle_at_7k(tmp_path: Path, n_samples: int) -> None:
    """The full gate (gates/niah.yaml, 24 samples) is run by hand; CI runs three needles (depths
    0, 0.5 and 1): each 7K prompt is a prefill of a minute or more on a 2-core machine."""
    ctx = gate(tmp_path, f"""
kind: niah
models: [smollm2-135m]
context_lengths: [7168]
samples: {n_samples}
n_predict: 128
arms: [dense]
thresholds: {{min_score: 1.0}}
""")
    (r,) = ctx.report.results
    assert r.error is None, r.error
    assert r.metrics["niah"] == 1.0, [s["output"] for s in r.samples if s["score"] < 1]
    assert all(abs(s["prompt_tokens"] - 7168) <= 0.02 * 7168 for s in r.samples)


def test_dense_smollm2_finds_needles_in_prose_at_2k(tmp_path: Path) -> None:
    """The prose haystack is a task the model can do: dense SmolLM2 finds a needle hidden in the
    prose of Python's documentation at 2K (one at each end and one in the middle), and one hidden
    among three distractor needles in prose; the report names the prose source."""
    ctx = gate(tmp_path, """
kind: niah
models: [smollm2-135m]
context_lengths: [2048]
samples: 3
tasks: [niah_single_2, niah_multikey_1]
n_predict: 16
arms: [dense]
""")
    (r,) = ctx.report.results
    assert r.error is None, r.error
    found = {(s["task"], s["index"]) for s in r.samples if s["score"] == 1.0}
    assert found >= {("niah_single_2", 0), ("niah_single_2", 1), ("niah_single_2", 2)}, r.samples
    assert any(t == "niah_multikey_1" for t, _ in found), r.samples
    assert any("prose haystack: pydoc_data.topics" in n for n in ctx.report.notes)
    assert all(abs(s["prompt_tokens"] - 2048) <= 0.02 * 2048 for s in r.samples)
    # every answer carries its decisive margin, read from the server's top-2 log-probabilities
    assert all(isinstance(s.get("margin"), float) and s["margin"] >= 0 for s in r.samples), r.samples


def test_niah_shared_prefill_answers_as_each_arm_alone(tmp_path: Path) -> None:
    """With shared_prefill each prompt is prefilled once (by the first arm) and every arm, the
    first included, answers from that slot restored (one token re-read, not the prompt): a second
    dense arm and the select-all anchor answer exactly as dense does, and exactly as dense answers
    without sharing; a top-K arm reads part of the restored cache."""
    arms = """
arms:
  - dense
  - {name: dense-again, flags: []}
  - {name: anchor, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-topk, "1048576"]}
  - {name: top-k, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-topk, "2", --sparse-attn-block-size, "32"]}
"""
    head = """
kind: niah
models: [tiny-qwen3]
context_lengths: [1024]
samples: 3
tasks: [niah_single_2]
n_predict: 8
"""
    (tmp_path / "shared").mkdir()
    (tmp_path / "alone").mkdir()
    shared = gate(tmp_path / "shared", head + "shared_prefill: true\n" + arms)
    alone = gate(tmp_path / "alone", head + "arms: [dense]\n")
    assert [r.arm for r in shared.report.results] == ["dense", "dense-again", "anchor", "top-k"]  # each once
    saved = json.loads((shared.out_dir / "report.json").read_text())
    assert [len(r["samples"]) for r in saved["results"]] == [3, 3, 3, 3]
    outputs = {r.arm: [x["output"] for x in r.samples] for r in shared.report.results}
    assert all(r.error is None for r in shared.report.results), [r.error for r in shared.report.results]
    assert len(outputs["dense"]) == 3 and all(outputs["dense"])
    assert outputs["dense-again"] == outputs["dense"] == outputs["anchor"]
    margins = {r.arm: [x.get("margin") for x in r.samples] for r in shared.report.results}
    assert margins["anchor"] == margins["dense"] and all(m is not None for m in margins["dense"]), margins
    assert [x["output"] for x in alone.report.results[0].samples] == outputs["dense"]
    assert len(outputs["top-k"]) == 3
    evaluated = {r.arm: [x.get("prompt_evaluated") for x in r.samples] for r in shared.report.results}
    assert all(n is not None and 1 <= n <= MAX_REUSED_TAIL for ns in evaluated.values() for n in ns), evaluated
    logs = sorted((shared.out_dir / "logs").glob("niah-top-k-*shared.log"))
    assert logs and "sparse attention: decode read" in logs[0].read_text()
    assert not list((shared.out_dir / "slots").glob("*.bin"))  # the shared slot is removed after the run


def test_niah_calibration_samples_come_first_and_freeze_scsa(tmp_path: Path) -> None:
    """An SCSA arm answers the calibration question before the scored ones and its taus are
    frozen by then, so no scored answer is decoded inside the calibration window; an arm that
    does not calibrate (dense) answers none."""
    ctx = gate(tmp_path, """
kind: niah
models: [tiny-qwen3]
context_lengths: [4096]
samples: 2
calibration_samples: 1
n_predict: 4
arms:
  - dense
  - {name: scsa, flags: [--sparse-attn, scsa, --scsa-calib-steps, "6", --scsa-rebuild-interval, "128",
                         --scsa-block-size, "512", --scsa-cluster-size, "32"]}
""")
    dense, scsa = ctx.report.results
    assert dense.error is None and scsa.error is None, (dense.error, scsa.error)
    assert dense.calibration == [] and len(dense.samples) == 2
    assert len(scsa.calibration) == 1 and len(scsa.samples) == 2 and scsa.metrics["samples"] == 2.0
    assert scsa.calibration[0]["depth"] == 0.5 and scsa.calibration[0]["key"] not in {s["key"] for s in scsa.samples}
    logs = sorted((ctx.out_dir / "logs").glob("niah-scsa-*.log"))
    assert logs, list((ctx.out_dir / "logs").iterdir())
    lines = [ln for ln in logs[0].read_text().splitlines() if "scsa: decode read" in ln]
    assert len(lines) == 3, lines   # one per request: the calibration answer, then the two scored
    assert "taus frozen" in lines[0] and "calibration 6 steps" in lines[0]
    data = json.loads((ctx.out_dir / "report.json").read_text())
    assert data["results"][1]["calibration"][0]["output"] == scsa.calibration[0]["output"]
    assert (ctx.out_dir / "samples" / "tiny-qwen3-4096-calibration.json").is_file()


def test_niah_staggered_requests_arrive_and_end_at_different_times(tmp_path: Path) -> None:
    """With `stagger`, requests under load arrive one after another while others are decoding
    and ask for different lengths, so they end at different times; each answer is compared with
    the same sample answered alone, asked for the same length."""
    ctx = gate(tmp_path, """
kind: niah
models: [tiny-qwen3]
context_lengths: [1024]
samples: 4
batch: [1, 2]
stagger: 0.05
tasks: [niah_single_2]
n_predict: 64
arms:
  - dense
""")
    alone, load = ctx.report.results
    assert alone.error is None and load.error is None, (alone.error, load.error)
    assert [s["index"] for s in load.samples] == [0, 1, 2, 3]
    assert "lost_under_load" in load.metrics and "same_answer_share" in load.metrics
    log = next((ctx.out_dir / "logs").glob("niah-dense-*-B2.log")).read_text().splitlines()
    events = [("start" if "launch_slot_" in ln else "end", ln) for ln in log
              if "launch_slot_" in ln or "release:" in ln]
    starts = [i for i, (kind, _) in enumerate(events) if kind == "start"]
    ends = [i for i, (kind, _) in enumerate(events) if kind == "end"]
    assert len(starts) == 4 and len(ends) >= 4, events
    # a request began while another was still running, and one ended before the last began
    assert starts[1] < ends[0] and ends[0] < starts[-1], events
    n_decoded = [int(ln.split("/")[-1].split("tokens")[0]) for ln in log
                 if " eval time =" in ln and "prompt eval time" not in ln]
    assert len(set(n_decoded)) > 1, n_decoded   # the answers' lengths differ


def test_niah_mix_sends_each_request_kind_and_compares_it_with_alone(tmp_path: Path) -> None:
    """With `mix`, sample i sends the i-th request kind in turn (greedy, JSON schema, sampled,
    backend-sampled), alone and under load; the deterministic ones are compared with alone, by
    answer and by the steps computed again that each response's timings report."""
    ctx = gate(tmp_path, """
kind: niah
models: [tiny-qwen3]
context_lengths: [1536]
samples: 4
batch: [1, 4]
stagger: 0.05
tasks: [niah_single_2]
n_predict: 32
mix: [greedy, json, sampled, backend]
json_schema: {type: object, properties: {answer: {type: string}}, required: [answer]}
arms:
  - {name: dense, flags: [--no-kv-unified]}
  - {name: sparse, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --no-kv-unified]}
""")
    dense_alone, dense_load, sparse_alone, sparse_load = ctx.report.results
    for r in ctx.report.results:
        assert r.error is None, r.error
        assert [x["request"] for x in r.samples] == ["greedy", "json", "sampled", "backend"]
    assert dense_load.metrics["deterministic_requests"] == 2
    assert dense_load.metrics["rechecks_changed_under_load"] == 0
    assert "changed_beyond_reference" not in dense_load.metrics            # dense is the reference
    assert "changed_beyond_reference" in sparse_load.metrics
    # the JSON request answers an object; the dense arm has no sparse figures, the sparse arm's
    # deterministic requests read sparsely
    assert sparse_alone.samples[1]["output"].lstrip().startswith("{")
    assert all(x["rechecked"] is None for x in dense_alone.samples)
    for x in sparse_alone.samples[:2]:
        assert x["rechecked"] is not None and 0 <= x["rechecked"][0] <= x["rechecked"][1] and x["rechecked"][1] > 0, x
    # sampled on the backend (no probabilities asked): a step llama-server sampled is never taken back
    assert sparse_alone.samples[3]["rechecked"][0] == 0 == sparse_load.samples[3]["rechecked"][0]
    assert sparse_load.metrics["rechecks_changed_under_load"] == 0, \
        [(a["rechecked"], b["rechecked"]) for a, b in zip(sparse_alone.samples, sparse_load.samples)]


def test_frontier_gate_puts_each_arm_at_its_needles_and_its_speed(tmp_path: Path) -> None:
    """One run: the needles of every arm (from dense's prefill), then every arm's speed against
    dense's at speed_context; one frontier point per arm, the select-all anchor on dense's
    needles exactly, and the plot drawn."""
    ctx = gate(tmp_path, """
kind: frontier
models: [tiny-qwen3]
context_lengths: [1024]
speed_context: 2048
samples: 2
tasks: [niah_single_2]
shared_prefill: true
n_predict: 8
repeats: 5
arms:
  - dense
  - {name: anchor, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-topk, "1048576"]}
  - {name: top-k, flags: [--sparse-attn, "on", --sparse-attn-min-kv, "0", --sparse-attn-topk, "2", --sparse-attn-block-size, "32", --sparse-attn-recheck, "0"], coverage: 0.25}
""")
    from llama_sparse.gates import frontier

    assert all(r.error is None for r in ctx.report.results), [r.error for r in ctx.report.results]
    kinds = [(r.arm, r.context, "niah" in r.metrics) for r in ctx.report.results]
    assert kinds == [("dense", 1024, True), ("anchor", 1024, True), ("top-k", 1024, True),
                     ("dense", 2048, False), ("anchor", 2048, False), ("top-k", 2048, False)]
    pts = {p.arm: p for p in frontier.points(ctx.report)}
    assert all(p.complete and p.total == 2 for p in pts.values())
    assert pts["dense"].ratio == 1.0 and pts["anchor"].lost == [] and pts["anchor"].found == pts["dense"].found
    assert pts["top-k"].read_fraction is not None and pts["top-k"].read_fraction < 1.0 and pts["top-k"].bound
    md = (ctx.out_dir / "report.md").read_text()
    assert "## Frontier:" in md and "| top-k | tiny-qwen3 | f16 | " in md
    assert (ctx.out_dir / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert ctx.report.verdict() is True
