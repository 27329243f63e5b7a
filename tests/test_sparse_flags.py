"""The --sparse-attn* flags in the tools: each tool's help lists them with their ranges and
defaults, the edges of every range are accepted and decode, and each flag does to a run what it
says. The values they refuse at start-up are tested with the settings table
(tests/test_sparse_settings.py)."""

from __future__ import annotations

import re
import subprocess

import pytest

from llama_sparse.binaries import binary

pytestmark = pytest.mark.slow


def test_llama_bench_runs_sparse(tiny_qwen3) -> None:
    proc = subprocess.run([str(binary("llama-bench")), "-m", str(tiny_qwen3), "-p", "0", "-n", "16", "-d", "1024",
                           "-r", "1", "-t", "2", "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-coverage", "0.25"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "block-sparse attention on (key sketch on the CPU, else key bounds, block 32, coverage 0.25," in proc.stderr
    assert "tg16" in proc.stdout


_BENCH_COUNTS = re.compile(r"llama-bench: block-sparse, timed runs: decode read ([\d.]+)% of the visible KV blocks; "
                           r"(\d+) of (\d+) steps computed again densely(.*)")


@pytest.mark.parametrize("recheck", ["0", "100"])
def test_llama_bench_reports_the_blocks_read_and_the_steps_computed_again(recheck: str, tiny_qwen3) -> None:
    """llama-bench decodes random tokens, on which the recheck computes again most steps: it says so."""
    proc = subprocess.run([str(binary("llama-bench")), "-m", str(tiny_qwen3), "-p", "0", "-n", "8", "-d", "1024",
                           "-r", "2", "-t", "2", "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-recheck", recheck],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = _BENCH_COUNTS.findall(proc.stderr)
    assert len(counts) == 1, proc.stderr[-2000:]
    read, rechecked, steps, hint = counts[0]
    # the timed runs' steps only (two runs of 8), not the depth's prefill nor a warm-up
    assert int(steps) == 16, counts
    if recheck == "0":
        assert int(rechecked) == 0 and hint == "", counts
        assert 0.0 < float(read) < 100.0, counts  # at most half of 32 blocks, the recent ones at least
    else:
        # every step of the random model is in doubt at 100 nats, and each one read every block again
        assert int(rechecked) == 16, counts
        assert float(read) > 100.0, counts
        assert "llama-bench decodes random tokens" in hint and "--sparse-attn-recheck 0" in hint, counts


def _help_entries(text: str) -> dict[str, str]:
    """flag -> its help, whitespace folded (llama-server wraps its help over lines)."""
    entries = {}
    for m in re.finditer(r"^\s*(--(?:sparse-attn|scsa)[\w-]*)\b(.*?)(?=^\s*-|\Z)", text, re.M | re.S):
        entries.setdefault(m.group(1), " ".join(m.group(2).split()))
    return entries


@pytest.mark.parametrize("tool", ["llama-server", "llama-bench"])
def test_help_lists_every_flag_with_its_range_and_default(tool: str) -> None:
    """Both tools print the table's rows: the same flags, ranges and defaults."""
    out = subprocess.run([str(binary(tool)), "--help"], capture_output=True, text=True, timeout=60)
    entries = _help_entries(out.stdout + out.stderr)
    for flag in ("--sparse-attn", "--sparse-attn-method", "--sparse-attn-block-size", "--sparse-attn-topk",
                 "--sparse-attn-coverage", "--sparse-attn-tolerance", "--sparse-attn-recheck", "--sparse-attn-recent",
                 "--sparse-attn-sink", "--sparse-attn-min-kv"):
        assert flag in entries, (flag, sorted(entries))
    # blocks of 32 rows by default: on prose they lose fewer needles than 64 (docs/needles-in-prose.md)
    assert "(a multiple of 32 in [32, 4096]; default: 32)" in entries["--sparse-attn-block-size"], entries
    # at most half the blocks with the key sketch (the default score on the CPU; a ceiling of a
    # quarter ends diffuse steps above the tolerance and tips a Gemma 3 needle at 16K), 0.625
    # with the bounds: the least that kept every needle dense finds in prose (docs/needles-in-prose.md)
    assert "(a number in (0, 1]; default: 0.5 with the key sketch, 0.625 with the key bounds)" in entries["--sparse-attn-coverage"], entries
    assert "(auto, bound or sketch; default: auto)" in entries["--sparse-attn-score"], entries
    # 0.03 with the key sketch, no floor: with the recheck taking thin steps back it kept every
    # needle dense finds in prose (docs/needles-in-prose.md); the bounds give no estimate to stop on
    assert "(a number in [0, 1]; default: 0.03 with the key sketch, 0 with the key bounds)" in entries["--sparse-attn-tolerance"], entries
    # a step whose two best tokens are within 0.25 nats is computed again densely: the one needle
    # the defaults lost in prose was one dense gives by 0.13 nats (docs/needles-in-prose.md); SCSA
    # computes none again unless asked
    assert "(a number in [0, 100]; default: 0.25 with either method)" in entries["--sparse-attn-recheck"], entries
    assert "(off, on, auto or scsa; default: off)" in entries["--sparse-attn"], entries
    assert "(block or scsa; default: block)" in entries["--sparse-attn-method"], entries


def test_llama_bench_default_coverage_is_the_servers(tiny_qwen3) -> None:
    proc = subprocess.run([str(binary("llama-bench")), "-m", str(tiny_qwen3), "-p", "0", "-n", "4", "-d", "256",
                           "-r", "1", "-t", "2", "--sparse-attn", "on", "--sparse-attn-min-kv", "0"],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("block-sparse attention on (key sketch on the CPU, else key bounds, block 32, coverage 0.5 with the key sketch, "
            "0.625 with the key bounds, tolerance 0.03 with the key sketch,") in proc.stderr


# the edges of every range are accepted, and the model decodes with them
EDGE_VALUES = [
    ["--sparse-attn-block-size", "32"], ["--sparse-attn-block-size", "4096"],
    ["--sparse-attn-topk", "0"], ["--sparse-attn-topk", "1"], ["--sparse-attn-topk", "1048576"],
    ["--sparse-attn-coverage", "1"], ["--sparse-attn-coverage", "0.001"],
    ["--sparse-attn-tolerance", "0"], ["--sparse-attn-tolerance", "1"],
    ["--sparse-attn-recheck", "0"], ["--sparse-attn-recheck", "100"],
    ["--sparse-attn-recent", "0"], ["--sparse-attn-recent", "1048576"],
    ["--sparse-attn-sink", "0"], ["--sparse-attn-sink", "1048576"],
    ["--sparse-attn-min-kv", "0"], ["--sparse-attn-min-kv", "16777216"],
]


@pytest.mark.parametrize("args", EDGE_VALUES, ids=[" ".join(a) for a in EDGE_VALUES])
def test_range_edges_accepted(args: list[str], tiny_qwen3, tmp_path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("The grass is green. " * 60)
    mode = "auto" if args[0] == "--sparse-attn-min-kv" else "on"
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(tiny_qwen3), "-f", str(prompt), "-c", "1024",
                           "-fa", "on", "--sparse-attn", mode, *args, "--dump-steps", "2",
                           "--dump-out", str(tmp_path / "o.bin")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote 3 rows" in proc.stderr


@pytest.fixture(scope="module")
def tiny_mamba(tmp_path_factory) -> "Path":
    from tiny_mamba import write_tiny_mamba

    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "tiny-mamba.gguf")


def test_model_the_method_cannot_serve_is_refused_naming_the_limit(tiny_mamba) -> None:
    proc = subprocess.run([str(binary("llama-server")), "-m", str(tiny_mamba), "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--port", "1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert ("block-sparse attention cannot serve this model: its memory is not a plain attention KV cache "
            "(recurrent or hybrid models are not supported)") in proc.stderr
    assert "with --sparse-attn auto such a model decodes dense" in proc.stderr


def test_auto_serves_such_a_model_dense(tiny_mamba, start_server) -> None:
    from llama_sparse.server import ServerConfig

    server = start_server(ServerConfig(model=tiny_mamba, ctx_size=512, extra_args=["--sparse-attn", "auto"]))
    out = server.complete("hello world", n_predict=4)
    assert out["tokens_predicted"] == 4
    log = server.wait_log("total time")
    assert "sparse_attn = auto (--sparse-attn auto): block-sparse attention cannot serve this model" in log
    assert "decoding dense" in log and "sparse-attention key bounds" not in log


@pytest.mark.parametrize("cache_type", ["f16", "q8_0"])
def test_no_fallback_warning_where_the_backend_runs_the_sizes(tiny_qwen3, start_server, cache_type: str) -> None:
    """At context creation each device holding K is asked whether it runs the selection and the
    block skip at the full cache size (a CUDA selection stops at 2048 blocks; this is 4096): a
    device that cannot is named in a warning, since decode would fall back to the CPU and copy
    the cache every step. The CPU runs every size, so it must start, decode, and say nothing."""
    from llama_sparse.server import ServerConfig

    server = start_server(ServerConfig(model=tiny_qwen3, ctx_size=131072, cache_type_k=cache_type,
                                       cache_type_v=cache_type, extra_args=["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "-lv", "4"]))
    assert server.complete("hello world", n_predict=4)["tokens_predicted"] == 4
    log = server.wait_log("decode read")
    assert "sparse-attention key bounds" in log and "4096 blocks" in log   # the check ran at this size
    assert "cannot run block-sparse attention" not in log


def _ledger_run(tiny_qwen3, tmp_path, *flags: str) -> str:
    """llama-sparse-logits on a 1.5K-token ledger, 8 decode steps with the key sketch: its log."""
    prompt = tmp_path / "p.txt"
    prompt.write_text(" ".join(f"Entry {i} of the ledger records {i * 37 % 101} crates of {('tea', 'salt', 'iron')[i % 3]}."
                               for i in range(90)))
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(tiny_qwen3), "-f", str(prompt), "-c", "4096",
                           "-fa", "on", "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-score", "sketch", *flags,
                           "--dump-steps", "8", "--dump-out", str(tmp_path / "o.bin")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stderr


def _blocks_read(tiny_qwen3, tmp_path, *flags: str) -> tuple[int, int]:
    # the selection alone: a step computed again densely would add its visible blocks
    log = _ledger_run(tiny_qwen3, tmp_path, "--sparse-attn-recheck", "0", *flags)
    m = re.search(r"block: read (\d+) of (\d+) visible blocks", log)
    assert m, log[-2000:]
    return int(m.group(1)), int(m.group(2))


def test_recheck_counts_the_steps_computed_again_and_their_blocks(tiny_qwen3, tmp_path) -> None:
    """A step computed again densely is counted, and so are the blocks it read: read_fraction is
    the cost against dense. 100 nats rechecks every step that skipped a block; 0 none."""
    def counts(value: str) -> tuple[int, int, int, int]:
        # the whole coverage: what a step reads depends on its visible blocks, not on its keys
        log = _ledger_run(tiny_qwen3, tmp_path, "--sparse-attn-tolerance", "0", "--sparse-attn-recheck", value)
        read = re.search(r"block: read (\d+) of (\d+) visible blocks", log)
        steps = re.search(r"block: (\d+) of (\d+) sparse decode steps computed again densely", log)
        assert read and steps, log[-2000:]
        return int(read.group(1)), int(read.group(2)), int(steps.group(1)), int(steps.group(2))

    read0, visible0, rechecked0, steps0 = counts("0")
    read, visible, rechecked, steps = counts("100")
    assert rechecked0 == 0 and steps0 == steps == 8, (rechecked0, steps0, steps)
    assert rechecked == 8, rechecked
    # the sparse pass read what it reads without the recheck (the steps saw the same blocks), and
    # the dense pass every visible block on top
    assert visible == visible0 > 0
    assert read == read0 + visible, (read, read0, visible)


def test_recheck_with_scsa_is_taken_not_ignored(tiny_qwen3, tmp_path) -> None:
    """SCSA computes thin steps again as the block method does: the value given is the one it runs
    with (what it takes back: tests/test_scsa_flags.py), and without the flag the block method's
    margin, 0.25 nats."""
    prompt = tmp_path / "p.txt"
    prompt.write_text("The grass is green. " * 60)
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(tiny_qwen3), "-f", str(prompt), "-c", "1024",
                           "-fa", "on", "--sparse-attn", "scsa", "--sparse-attn-recheck", "0.5",
                           "--dump-steps", "2", "--dump-out", str(tmp_path / "o.bin"), "-v"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the settings line (verbose), once per context the tool creates
    settings = [line for line in proc.stderr.splitlines() if "sparse_attn           = scsa" in line]
    assert settings and all(line.endswith(", recheck 0.5)") for line in settings), settings or proc.stderr[-2000:]
    assert "applies to the block method" not in proc.stderr
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(tiny_qwen3), "-f", str(prompt), "-c", "1024",
                           "-fa", "on", "--sparse-attn", "scsa",
                           "--dump-steps", "2", "--dump-out", str(tmp_path / "o.bin"), "-v"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if line.endswith(", recheck 0.25)") and "= scsa" in line], proc.stderr[-2000:]


def test_tolerance_makes_the_coverage_a_ceiling(tiny_qwen3, tmp_path) -> None:
    """--sparse-attn-tolerance 0 reads the whole coverage; a tolerance reads at most that, fewer
    blocks the looser it is, and no floor: 1 (every stand-in good enough) reads only the blocks
    every step must read (sinks, recent rows), what a budget of one block reads. The default is 0.03."""
    whole, visible = _blocks_read(tiny_qwen3, tmp_path, "--sparse-attn-tolerance", "0")
    default, visible_d = _blocks_read(tiny_qwen3, tmp_path)
    explicit, visible_e = _blocks_read(tiny_qwen3, tmp_path, "--sparse-attn-tolerance", "0.03")
    looser, visible_t = _blocks_read(tiny_qwen3, tmp_path, "--sparse-attn-tolerance", "0.1")
    loosest, visible_l = _blocks_read(tiny_qwen3, tmp_path, "--sparse-attn-tolerance", "1")
    forced, visible_f = _blocks_read(tiny_qwen3, tmp_path, "--sparse-attn-tolerance", "0", "--sparse-attn-topk", "1")
    assert visible == visible_d == visible_e == visible_t == visible_l == visible_f > 0
    assert whole >= 0.25 * visible, (whole, visible)
    assert default == explicit, (default, explicit)
    assert loosest <= looser <= default <= whole and loosest < whole, (loosest, looser, default, whole)
    # no floor under the tolerance (half the coverage until the recheck guarded thin steps)
    assert loosest == forced, (loosest, forced)
    assert 2 * loosest < whole, (loosest, whole)


def test_tolerance_with_the_key_bounds_is_reported_not_ignored(tiny_qwen3, tmp_path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("The grass is green. " * 60)
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(tiny_qwen3), "-f", str(prompt), "-c", "1024",
                           "-fa", "on", "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-score", "bound", "--sparse-attn-tolerance", "0.03",
                           "--dump-steps", "2", "--dump-out", str(tmp_path / "o.bin")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--sparse-attn-tolerance) 0.03 applies to the key sketch; the key bounds read the whole coverage" in proc.stderr
    # the default tolerance is the score's own: with the bounds, 0, and nothing to report
    proc = subprocess.run([str(binary("llama-sparse-logits")), "-m", str(tiny_qwen3), "-f", str(prompt), "-c", "1024",
                           "-fa", "on", "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-score", "bound", "-lv", "4",
                           "--dump-steps", "2", "--dump-out", str(tmp_path / "o.bin")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "applies to the key sketch" not in proc.stderr
    assert "key bounds, block 32, coverage 0.625, sink" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("sparse, parallel, slots, unified", [
    ([], -1, 4, True),                                   # upstream's automatic slots: 4, one unified cache
    (["--sparse-attn", "on", "--sparse-attn-min-kv", "0"], -1, 1, False),             # the block method: one slot with the whole context
    (["--sparse-attn", "auto"], -1, 1, False),
    (["--sparse-attn", "on", "--sparse-attn-min-kv", "0"], 2, 2, False),              # asked for: a KV stream per slot
    (["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--kv-unified"], 2, 2, True),  # asked for, warned about
])
def test_slot_layout_with_sparse_attention(tiny_qwen3, start_server, sparse: list[str], parallel: int, slots: int,
                                           unified: bool) -> None:
    """llama-server's automatic slot count shares one unified KV cache among 4 slots, where the
    block method reads every slot's cells and the blocks slots fill together whole (slower than
    dense there, docs/results/ab-parallel4-layout-smollm2.md): with sparse attention it takes one
    slot with the whole context and says why; a layout the user asks for is kept."""
    from llama_sparse.server import ServerConfig

    server = start_server(ServerConfig(model=tiny_qwen3, ctx_size=1024, parallel=parallel, extra_args=sparse))
    assert server.props()["total_slots"] == slots
    log = server.wait_log("kv_unified")
    assert f"kv_unified = '{'true' if unified else 'false'}'" in log
    assert ("sparse attention: one slot with the whole context" in log) == (sparse != [] and parallel == -1)
    assert ("sparse attention with --kv-unified and 2 slots" in log) == ("--kv-unified" in sparse)
    assert server.complete("hello world", n_predict=4)["tokens_predicted"] == 4


def _short_and_long() -> tuple[str, str]:
    """About 1,700 and 4,700 tokens of the tiny model: below the 4096-row minimum and past it."""
    from llama_sparse.gates.texts import reference_text

    text = reference_text()
    return text[:1800], text[:5000]


def _typed_and_everywhere(start_server, model, mode: str):
    """A server of `--sparse-attn mode` as typed, which says its minimum at start-up, and one that
    reads sparsely at every length (--sparse-attn-min-kv 0), which does not."""
    from llama_sparse.server import ServerConfig

    typed = start_server(ServerConfig(model=model, ctx_size=8192, cache_prompt=False,
                                      extra_args=["--sparse-attn", mode, "-lv", "4"]))
    assert "dense while the visible KV is shorter than 4096 rows" in typed.wait_log("dense while the visible KV")
    everywhere = start_server(ServerConfig(model=model, ctx_size=8192, cache_prompt=False,
                                           extra_args=["--sparse-attn", mode, "--sparse-attn-min-kv", "0", "-lv", "4"]))
    assert "dense while the visible KV" not in everywhere.read_log()
    return typed, everywhere


def test_on_decodes_dense_below_its_minimum_and_sparse_from_it(start_server, tiny_qwen3) -> None:
    """`--sparse-attn on`, the switch users type, keeps the block method dense while the visible KV
    is shorter than --sparse-attn-min-kv (4096 rows): short prompts gain little from it and can
    lose an answer to it. From the minimum on it reads sparsely; --sparse-attn-min-kv 0 reads
    sparsely at every length. Each response's timings say which it was."""
    short, long_ = _short_and_long()
    on, everywhere = _typed_and_everywhere(start_server, tiny_qwen3, "on")
    below = on.complete(short, n_predict=8, ignore_eos=True)["timings"]["sparse"]
    assert below["steps_sparse"] == 0 and below["blocks_visible"] == 0, below
    above = on.complete(long_, n_predict=8, ignore_eos=True)["timings"]["sparse"]
    assert above["steps_sparse"] == 7 and above["blocks_visible"] > 0, above
    short_sparse = everywhere.complete(short, n_predict=8, ignore_eos=True)["timings"]["sparse"]
    assert short_sparse["steps_sparse"] == 7 and short_sparse["blocks_visible"] > 0, short_sparse


def test_scsa_decodes_dense_below_the_minimum_and_through_its_plans_from_it(start_server, tiny_qwen3) -> None:
    """`--sparse-attn scsa` keeps the same minimum as the block method: below 4096 visible rows a
    step is dense (its plans are brought up to the cache's length on the first step past it), so a
    short prompt neither loses an answer to SCSA nor calibrates its taus; the first request that
    reaches the minimum calibrates them."""
    short, long_ = _short_and_long()
    scsa, everywhere = _typed_and_everywhere(start_server, tiny_qwen3, "scsa")
    below = scsa.complete(short, n_predict=8, ignore_eos=True)["timings"]["sparse"]
    assert below["rows_visible"] == 0 and below["calibration_steps"] == 0 and not below["calibrated"], below
    above = scsa.complete(long_, n_predict=8, ignore_eos=True)["timings"]["sparse"]
    assert above["calibration_steps"] == 7, above    # 8 tokens: 7 decode steps, each recorded for the taus
    # the log's line, as the block method's, only for a request a step of which went through SCSA
    assert len(re.findall(r"task \d+ \| scsa: decode read", scsa.wait_log("scsa: decode read"))) == 1
    short_sparse = everywhere.complete(short, n_predict=8, ignore_eos=True)["timings"]["sparse"]
    assert short_sparse["calibration_steps"] == 7, short_sparse


@pytest.mark.parametrize("method", ["on", "scsa"])
def test_a_short_request_beside_a_long_one_decodes_dense(start_server, tiny_qwen3, method) -> None:
    """The minimum is each sequence's own: a short request decoding beside a long one (two slots,
    a KV stream each) is dense as it is alone, though the micro-batch that would hold both
    attends a view as long as the longer one. Before, the short request's steps were read
    sparsely under load and densely alone."""
    import threading
    import time

    from llama_sparse.gates.texts import reference_text
    from llama_sparse.server import ServerConfig

    text = reference_text()
    short, long_ = text[:1800], text[20000:25000]   # about 1,700 and 4,700 tokens of the tiny model
    server = start_server(ServerConfig(model=tiny_qwen3, ctx_size=2 * 6144, parallel=2, cache_prompt=False,
                                       extra_args=["--sparse-attn", method, "--no-kv-unified",
                                                   # SCSA through its plans from the first step
                                                   *(["--scsa-calib-steps", "0"] if method == "scsa" else [])]))
    done: dict[str, tuple[float, dict]] = {}

    def ask(name: str, prompt: str, n: int) -> None:
        resp = server.complete(prompt, n_predict=n, ignore_eos=True)
        done[name] = (time.monotonic(), resp["timings"]["sparse"])

    long_thread = threading.Thread(target=ask, args=("long", long_, 1024))
    long_thread.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:   # the long request decoding before the short one arrives
        slots = server.request("GET", "/slots")
        if any(s.get("is_processing") and s.get("next_token", [{}])[0].get("n_decoded", 0) > 0 for s in slots):
            break
        time.sleep(0.05)
    ask("short", short, 16)
    long_thread.join()
    assert done["short"][0] < done["long"][0], "the short request did not decode beside the long one"
    short_fig, long_fig = done["short"][1], done["long"][1]
    if method == "on":
        assert short_fig["steps_sparse"] == 0 and short_fig["blocks_visible"] == 0, short_fig
        assert long_fig["steps_sparse"] == 1023, long_fig
    else:
        assert short_fig["rows_visible"] == 0 and short_fig["rows_read"] == 0, short_fig
        assert long_fig["rows_visible"] > 0, long_fig
