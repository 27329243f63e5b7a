"""SCSA's flags and start-up checks: the range edges are accepted and decode, several slots are
served with a KV cache each, and what the operator cannot serve (a KV type it cannot read, slots
sharing one unified cache, a recurrent model, a malformed taus file) is refused with the reason.
The values and combinations refused at start-up (every --scsa-* flag out of its range, a block
size that is not a multiple of the interval, flash attention off) are tested with the settings
table, in tests/test_sparse_settings.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from llama_sparse.binaries import binary
from llama_sparse.server import ServerConfig
from llama_sparse.timings import SCSA_LINE
from startup import refuses

pytestmark = pytest.mark.slow


def test_help_lists_every_flag() -> None:
    out = subprocess.run([str(binary("llama-server")), "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    for flag in ("--scsa-tolerance", "--scsa-max-error", "--scsa-calib-steps", "--scsa-taus ", "--scsa-taus-out", "--scsa-hierarchical",
                 "--scsa-packed", "--scsa-cluster-size", "--scsa-rebuild-interval", "--scsa-block-size",
                 "--scsa-sink", "--scsa-recent", "'scsa'"):
        assert flag in text, flag


def test_the_default_tolerance_is_the_one_that_kept_the_needles() -> None:
    for tool in ("llama-server", "llama-bench"):
        out = subprocess.run([str(binary(tool)), "--help"], capture_output=True, text=True, timeout=60)
        # llama-server wraps its help: the default may stand on the flag's next line
        found = re.search(r"--scsa-tolerance \S+\s.*?default: ([0-9.]+)\)", out.stdout + out.stderr, re.S)
        assert found and found.group(1) == "0.0125", (tool, found and found.group(0))


def test_llama_bench_help_lists_every_flag() -> None:
    out = subprocess.run([str(binary("llama-bench")), "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    for flag in ("--sparse-attn <off|on|auto|scsa>", "--sparse-attn-method <block|scsa>", "--scsa-tolerance",
                 "--scsa-max-error", "--scsa-calib-steps", "--scsa-taus ", "--scsa-taus-out", "--scsa-hierarchical",
                 "--scsa-packed", "--scsa-cluster-size", "--scsa-rebuild-interval", "--scsa-block-size", "--scsa-sink",
                 "--scsa-recent"):
        assert flag in text, flag


SMALL_PLANS = ["--scsa-rebuild-interval", "64", "--scsa-block-size", "256"]


def run_bench(model: Path, *args: str, depth: int = 2048) -> subprocess.CompletedProcess:
    # 16 tokens, 2 repetitions: 32 timed decode steps, fewer than the 33 a calibration takes, so
    # taus frozen after the timed runs means the calibration ran before them
    return subprocess.run([str(binary("llama-bench")), "-m", str(model), "-p", "0", "-n", "16", "-d", str(depth), "-r", "2",
                           "-t", "2", "--progress", "--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", *SMALL_PLANS, *args],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_llama_bench_calibrates_before_the_timed_runs(tiny_qwen3) -> None:
    proc = run_bench(tiny_qwen3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the tolerance that kept every needle dense found in prose, in every tool alike
    assert "llama-bench: SCSA (tolerance 0.0125," in proc.stderr
    assert "calibrated in 33 untimed decode steps at each test's depth" in proc.stderr
    lines = proc.stderr.splitlines()
    calib = lines.index("llama-bench: benchmark 1/1: SCSA calibration run (33 decode steps at depth 2048)")
    first_timed = lines.index("llama-bench: benchmark 1/1: generation run 1/2")
    assert calib < first_timed
    # the depth prefilled for the calibration is restored, not prefilled again
    assert "llama-bench: benchmark 1/1: depth run 1/2 (cached)" in lines
    summary = [x for x in lines if x.startswith("llama-bench: SCSA, timed runs: decode read ")]
    assert len(summary) == 1 and "taus frozen;" in summary[0], summary
    # 32 decode steps x 2 layers x 8 query heads, none exact: every attention went through the plans,
    # and the plans were built before the timed steps, in the untimed step each run starts with
    assert "(512 attentions through the plans, 0 exact, 0 plan builds)" in summary[0]
    assert "plans built in an untimed decode step before each run" in summary[0]
    assert "tg16 @ d2048" in proc.stdout


def test_llama_bench_calibration_fits_the_context(tiny_qwen3) -> None:
    # depth + 16 tokens is 2048, a context with no room for the 33 calibration steps unless
    # llama-bench makes room for them
    proc = run_bench(tiny_qwen3, depth=2032)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SCSA calibration run (33 decode steps at depth 2032)" in proc.stderr
    assert "tg16 @ d2032" in proc.stdout


def test_llama_bench_with_taus_runs_no_calibration(tiny_qwen3, tmp_path) -> None:
    taus = tmp_path / "taus.json"
    taus.write_text("{" + ", ".join(f'"{layer}:{head}": 0.05' for layer in range(2) for head in range(8)) + "}")
    proc = run_bench(tiny_qwen3, "--scsa-taus", str(taus))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"taus from {taus}" in proc.stderr
    assert "SCSA calibration run" not in proc.stderr
    assert "(512 attentions through the plans, 0 exact," in proc.stderr and "taus frozen" in proc.stderr


def test_llama_bench_calibrates_the_heads_a_taus_file_leaves_out(tiny_qwen3, tmp_path) -> None:
    taus = tmp_path / "taus.json"
    taus.write_text('{"0:0": 0.05}')
    proc = run_bench(tiny_qwen3, "--scsa-taus", str(taus))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "heads it does not name calibrated in 33 untimed decode steps" in proc.stderr
    assert "SCSA calibration run (33 decode steps at depth 2048)" in proc.stderr
    assert "(512 attentions through the plans, 0 exact," in proc.stderr and "taus frozen" in proc.stderr


def test_llama_bench_refusals_say_why(tiny_qwen3, tmp_path) -> None:
    assert f"error: --scsa-taus: cannot read '{tmp_path / 'nope.json'}'" in refuses(
        "llama-bench", tiny_qwen3, ["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-taus", str(tmp_path / "nope.json")])
    # the library's reason reaches the user although llama-bench keeps its log quiet otherwise
    msg = refuses("llama-bench", tiny_qwen3, ["-p", "0", "-n", "4", "-d", "64", "-ctk", "q4_0", "--sparse-attn", "scsa", "--sparse-attn-min-kv", "0"])
    assert "SCSA reads the KV cache directly and needs it f16 or q8_0; this cache is K q4_0, V f16" in msg


def run_logits(model: Path, tmp_path: Path, *args: str, steps: int = 2, ctx: int = 1024,
               prompt_text: str = "The grass is green. " * 200) -> subprocess.CompletedProcess:
    prompt = tmp_path / "p.txt"
    prompt.write_text(prompt_text)
    return subprocess.run([str(binary("llama-sparse-logits")), "-m", str(model), "-f", str(prompt), "-c", str(ctx),
                           "-fa", "on", "--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", *args, "--dump-steps", str(steps),
                           "--dump-prompt-tokens", str(ctx - steps - 1), "--dump-out", str(tmp_path / "o.bin")], capture_output=True, text=True, timeout=300)


# the edges of every range are accepted, and the model decodes with them (small sizes so that
# the plans hold clusters within the 1024-token test context)
EDGE_VALUES = [
    ["--scsa-tolerance", "1"], ["--scsa-tolerance", "0.0001"],
    ["--scsa-max-error", "10"], ["--scsa-max-error", "0.0001"],
    ["--scsa-calib-steps", "0"], ["--scsa-calib-steps", "4096"],
    ["--scsa-cluster-size", "8"], ["--scsa-cluster-size", "4096"],
    ["--scsa-rebuild-interval", "32", "--scsa-block-size", "64"],
    ["--scsa-rebuild-interval", "65536", "--scsa-block-size", "65536"],
    ["--scsa-block-size", "1048576", "--scsa-rebuild-interval", "32"],
    ["--scsa-sink", "0"], ["--scsa-sink", "65536"],
    ["--scsa-recent", "0"], ["--scsa-recent", "65536"],
    ["--scsa-packed", "f16"], ["--scsa-packed", "q8_0"], ["--scsa-hierarchical"],
]


@pytest.mark.parametrize("args", EDGE_VALUES, ids=[" ".join(a) for a in EDGE_VALUES])
def test_range_edges_accepted(args: list[str], tiny_qwen3, tmp_path) -> None:
    small = [] if "--scsa-rebuild-interval" in args else ["--scsa-rebuild-interval", "64", "--scsa-block-size", "256"]
    proc = run_logits(tiny_qwen3, tmp_path, *small, *args, steps=4)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote 5 rows" in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["-ctk", "q4_0", "-ctv", "q4_0"], "SCSA reads the KV cache directly and needs it f16 or q8_0; this cache is K q4_0, V q4_0"),
    (["-ctk", "q5_1"], "needs it f16 or q8_0; this cache is K q5_1, V f16"),
    (["-ctv", "bf16"], "needs it f16 or q8_0; this cache is K f16, V bf16"),
])
def test_kv_type_it_cannot_read_is_refused(args: list[str], message: str, tiny_qwen3, tmp_path) -> None:
    proc = run_logits(tiny_qwen3, tmp_path, *args)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_several_slots_in_one_unified_cache_refused(tiny_qwen3) -> None:
    # SCSA plans each sequence in its own KV stream: a cache shared by the slots mixes their cells
    proc = subprocess.run([str(binary("llama-server")), "-m", str(tiny_qwen3), "--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "-np", "2",
                           "--kv-unified", "--port", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert ("--sparse-attn scsa plans each slot's sequence in a KV cache of its own, and --kv-unified shares one "
            "among the 2 slots: use --no-kv-unified, or --parallel 1") in proc.stderr


def test_several_slots_served_with_a_cache_each(tiny_qwen3, start_server) -> None:
    """--parallel 4 (a cache per slot, llama.cpp's default with an explicit slot count): two
    requests at once decode in the same micro-batches, and each slot's log line counts its own
    request's reads, not the other's."""
    import concurrent.futures

    from llama_sparse.gates import texts

    server = start_server(ServerConfig(model=tiny_qwen3, ctx_size=8192, parallel=4, threads=2,
                                       extra_args=["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-calib-steps", "0",
                                                   "--scsa-rebuild-interval", "128", "--scsa-block-size", "512",
                                                   "--scsa-cluster-size", "32"]), "scsa-np4")
    text = texts.reference_text()
    prompts = [server.tokenize(text[i * 6000:(i + 1) * 6000])[:n] for i, n in enumerate((1500, 700))]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda p: server.complete(p, n_predict=24, ignore_eos=True), prompts))
    assert all(a["tokens_predicted"] == 24 for a in answers)
    lines = list(SCSA_LINE.finditer(server.wait_log("scsa: decode read", count=2)))
    assert len(lines) == 2 and all(m["calls"] is not None for m in lines), [m.group(0) for m in lines]
    # the rows one call (a query head's attention for one token) saw, on average: its own
    # sequence's context, between the prompt and the prompt plus the tokens generated. A line
    # counting both slots would average the two contexts and miss both ranges. (A token of one
    # slot's prompt can share a micro-batch with the other's decode and go through the plans:
    # the calls counted, not a fixed step count, are the divisor)
    # Each slot audits the first 4 decode steps after its prompt (exact, --scsa-audit-steps) on its
    # own: the audits of one slot are not the other's.
    assert [int(m["audited"]) for m in lines] == [4, 4], [m.group(0) for m in lines]
    per_call = sorted((int(m["visible"]) / int(m["calls"]), int(m["calls"])) for m in lines)
    for (mean, calls), n in zip(per_call, sorted(len(p) for p in prompts)):
        assert calls >= 2 * 8 * 19, per_call          # 23 decode steps less 4 audits, 2 layers, 8 heads at least
        assert n <= mean <= n + 24, (per_call, [len(p) for p in prompts])


@pytest.fixture(scope="module")
def tiny_mamba(tmp_path_factory) -> Path:
    from tiny_mamba import write_tiny_mamba

    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")


def test_model_it_cannot_serve_is_refused(tiny_mamba, tmp_path) -> None:
    proc = run_logits(tiny_mamba, tmp_path)
    assert proc.returncode != 0
    assert ("sparse_attn = scsa (--sparse-attn scsa): its memory is not a plain attention KV cache "
            "(recurrent or hybrid models are not supported)") in proc.stderr


MALFORMED_TAUS = [
    ("", "no opening {"),
    ('{"0:0": 0.05', "expected , or } after the value of \"0:0\""),
    ('{"0-0": 0.05}', "key \"0-0\" is not \"layer:head\""),
    # 2^32 wraps to 0 through sscanf's %d: the file would set layer 0's tau without a word
    ('{"4294967296:0": 0.05}', "key \"4294967296:0\" is not \"layer:head\" with two integers in [0, 2147483647]"),
    ('{"0:2147483648": 0.05}', "key \"0:2147483648\" is not \"layer:head\" with two integers in [0, 2147483647]"),
    ('{"0:0": 0.05, "1:1": 0.1, "0:0": 0.2}', "key \"0:0\" appears twice"),
    ('{"0:0": "low"}', "the value of \"0:0\" is not a number"),
    ('{"0:0": 1.5}', "tau 1.500000 of \"0:0\" is outside [0, 1)"),
    ('{"0:0": 0.05, "0:0": 0.1}', "key \"0:0\" appears twice"),
    ('{"0:0": 0.05} trailing', "text after the closing }"),
]


@pytest.mark.parametrize("text,message", MALFORMED_TAUS, ids=[m for _, m in MALFORMED_TAUS])
def test_malformed_taus_json_refused(text: str, message: str, tiny_qwen3, tmp_path) -> None:
    taus = tmp_path / "taus.json"
    taus.write_text(text)
    proc = run_logits(tiny_qwen3, tmp_path, "--scsa-taus", str(taus))
    assert proc.returncode != 0
    assert f"{taus}: malformed SCSA taus JSON at byte" in proc.stderr
    assert message in proc.stderr


@pytest.mark.parametrize("text,message", [
    ('{"7:0": 0.05}', "layer 7 has no SCSA plans (the model has 2 layers"),
    ('{"1:8": 0.05}', "layer 1 has 8 query heads, the file names head 8"),
])
def test_taus_naming_what_the_model_lacks_refused(text: str, message: str, tiny_qwen3, tmp_path) -> None:
    taus = tmp_path / "taus.json"
    taus.write_text(text)
    proc = run_logits(tiny_qwen3, tmp_path, "--scsa-taus", str(taus))
    assert proc.returncode != 0
    assert message in proc.stderr


def test_missing_taus_file_refused(tiny_qwen3, tmp_path) -> None:
    proc = run_logits(tiny_qwen3, tmp_path, "--scsa-taus", str(tmp_path / "nope.json"))
    assert proc.returncode != 0
    assert f"cannot read the taus file {tmp_path / 'nope.json'}" in proc.stderr


def test_unwritable_taus_out_refused_before_any_work(tiny_qwen3, tmp_path) -> None:
    proc = run_logits(tiny_qwen3, tmp_path, "--scsa-taus-out", str(tmp_path / "no" / "such" / "dir" / "t.json"))
    assert proc.returncode != 0
    assert "cannot write the taus file" in proc.stderr


@pytest.mark.parametrize("args", [["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0"], ["--sparse-attn", "on", "--sparse-attn-method", "scsa", "--sparse-attn-min-kv", "0"],
                                  ["--sparse-attn-method", "scsa", "--sparse-attn", "on", "--sparse-attn-min-kv", "0"]],
                         ids=["short", "on then method", "method then on"])
def test_the_method_flag_selects_scsa(args: list[str], tiny_qwen3, start_server) -> None:
    """--sparse-attn says when, --sparse-attn-method which; in either order they serve SCSA, as the
    short form does (one slot, its per-request line)."""
    from llama_sparse.server import ServerConfig

    server = start_server(ServerConfig(model=tiny_qwen3, ctx_size=2048, extra_args=args))
    assert server.complete("The grass is green. " * 40, n_predict=8)["tokens_predicted"] == 8
    log = server.wait_log("scsa: decode read")
    assert "taus frozen" in log or "calibrating" in log
    assert "of the visible KV blocks" not in log   # not the block method


def test_the_method_alone_does_not_switch_sparse_attention_on(tiny_qwen3, start_server) -> None:
    from llama_sparse.server import ServerConfig

    server = start_server(ServerConfig(model=tiny_qwen3, ctx_size=2048, extra_args=["--sparse-attn-method", "scsa"]))
    assert server.complete("The grass is green. " * 40, n_predict=4)["tokens_predicted"] == 4
    log = server.wait_log("total time")
    assert "scsa: decode read" not in log and "of the visible KV blocks" not in log


SCSA_NO_AUDIT = ["--sparse-attn", "scsa", "--sparse-attn-min-kv", "0", "--scsa-calib-steps", "0", "--scsa-audit-steps", "0",
                 "--scsa-rebuild-interval", "128", "--scsa-block-size", "512", "--scsa-cluster-size", "32"]


def _first_tokens_probs(server, prompt: list[int]) -> dict:
    return server.complete(prompt, n_predict=12, ignore_eos=True, n_probs=4, return_tokens=True)


def test_a_recheck_takes_back_thin_scsa_steps(tiny_qwen3, start_server) -> None:
    """--sparse-attn-recheck with SCSA (0.25 nats unless given): a step whose two best tokens are
    closer than the recheck and whose attention read some row other than exactly from the cache is
    computed again densely. A recheck no logit gap escapes takes back every such step, so each
    answer token is dense's, bit for bit; with the recheck at 0 SCSA computes none again and its
    figures say so."""
    from llama_sparse.gates import texts

    config = dict(model=tiny_qwen3, ctx_size=4096, threads=2, cache_prompt=False)
    dense = start_server(ServerConfig(**config), "dense")
    prompt = dense.tokenize(texts.reference_text()[:9000])[:1800]
    want = _first_tokens_probs(dense, prompt)

    plain = _first_tokens_probs(start_server(ServerConfig(**config, extra_args=[*SCSA_NO_AUDIT, "--sparse-attn-recheck", "0"]), "scsa"), prompt)
    sp = plain["timings"]["sparse"]
    assert sp["steps_rechecked"] == 0 and sp["rows_read"] < sp["rows_visible"], sp
    assert plain["completion_probabilities"] != want["completion_probabilities"], \
        "SCSA read every row it saw here: the recheck would have nothing to take back"

    every = _first_tokens_probs(start_server(ServerConfig(**config, extra_args=[*SCSA_NO_AUDIT, "--sparse-attn-recheck", "100"]),
                                             "scsa-recheck"), prompt)
    sp = every["timings"]["sparse"]
    # the prompt's last row gives the first token densely; the 11 steps after it each skipped
    # rows, and each was taken back
    assert sp["steps_rechecked"] == 11, sp
    assert every["tokens"] == want["tokens"]
    assert every["completion_probabilities"] == want["completion_probabilities"]
