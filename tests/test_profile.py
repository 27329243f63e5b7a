"""`llama-sparse profile`: a perf sample goes to the first part its stack names."""

from llama_sparse import profile

# `perf script -F comm,tid,time,event,ip,sym,dso` as perf prints it: a header line per sample,
# then its frames, leaf first
SCRIPT = """\
llama-server  7452  2475.158974:    1001001 cpu-clock:ppp: 
\t          13ec22 ggml_sparse_attn_sketch_lse+0x422 (/b/libggml-cpu.so)
\t          140000 ggml_compute_forward_sparse_attn_select+0x40 (/b/libggml-cpu.so)

llama-server  7452  2475.159974:    1001001 cpu-clock:ppp: 
\t           8f3a0 __ieee754_log_fma+0x20 (/usr/lib/x86_64-linux-gnu/libm.so.6)
\t          13ec22 ggml_sparse_attn_sketch_lse+0x500 (/b/libggml-cpu.so)

llama-server  7452  2475.160974:    1001001 cpu-clock:ppp: 
\t          151000 std::__adjust_heap<int*, long, int>+0x10 (/b/libggml-cpu.so)
\t          150000 ggml_sparse_attn_select_one+0x90 (/b/libggml-cpu.so)

llama-server  7453  2475.161974:    1001001 cpu-clock:ppp: 
\t           1f7da [unknown] (/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0)
\t           1f000 [unknown] (/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0)

llama-server  7453  2475.162974:    1001001 cpu-clock:ppp: 
\t          160000 ggml_vec_dot_f16+0x10 (/b/libggml-cpu.so)
\t          161000 ggml_compute_forward_flash_attn_ext_f16_one_chunk+0x10 (/b/libggml-cpu.so)

llama-server  7453  2475.163974:    1001001 cpu-clock:ppp: 
\t          170000 ggml_flash_attn_ext_sparse_tiles<3>+0x10 (/b/libggml-cpu.so)
\t          161000 ggml_compute_forward_flash_attn_ext_f16_one_chunk+0x10 (/b/libggml-cpu.so)
\t           1f000 gomp_thread_start+0x10 (/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0)

llama-server  7453  2475.164974:    1001001 cpu-clock:ppp: 
\t          180000 ggml_vec_dot_q4_1_q8_1+0x10 (/b/libggml-cpu.so)

llama-server  7453  2475.165974:    1001001 cpu-clock:ppp: 
\t          180000 ggml_vec_dot_q8_0_q8_0+0x10 (/b/libggml-cpu.so)
\t          1a0000 scsa_op::worker::add_cluster_rows+0x10 (/b/libggml-cpu.so)
\t          1a1000 scsa_op::attend_calibrate+0x10 (/b/libggml-cpu.so)
\t          1a2000 scsa_attn_stream+0x10 (/b/libggml-cpu.so)

llama-server  7453  2475.166974:    1001001 cpu-clock:ppp: 
\t          190000 ggml_compute_forward_rms_norm_mul_fused+0x10 (/b/libggml-cpu.so)
\t          191000 ggml_graph_compute_thread.isra.0+0x10 (/b/libggml-cpu.so)
"""


def test_every_sample_is_counted_once_by_the_first_part_its_stack_names():
    stacks = profile.samples_of(SCRIPT)
    assert len(stacks) == 9
    parts = [profile.part_of(s) for s in stacks]
    assert parts == [
        "key sketch: scores",
        "key sketch: scores",          # the log inside the scoring kernel: the caller decides
        "block selection: walk",       # the heap of the walk, by its caller
        "threads waiting (barriers)",  # an unnamed frame of libgomp
        "flash attention: rows, unread blocks' tail",
        "flash attention: selected blocks",  # a worker thread: its stack's root is in libgomp
        "weights (matrix products)",   # a vec_dot leaf whose stack ends there
        "SCSA: exact steps (calibration, audits)",  # the same kind of leaf, its callers known
        profile.OTHER,
    ]
    shares = profile.shares(stacks)
    assert abs(sum(shares.values()) - 1.0) < 1e-9
    assert shares["key sketch: scores"] == 2 / 9


def test_a_table_gives_each_part_its_share_of_the_step():
    p = profile.Profile(context=32768, steps=63, ms_per_step=40.0, ms_per_step_unsampled=37.5, samples=100,
                        parts=[profile.Part("key sketch: scores", 0.25, 10.0), profile.Part(profile.OTHER, 0.75, 30.0)],
                        sparse={"method": "block"})
    t = profile.table(p)
    assert "63 decode steps at 32768 tokens, 40.0 ms a step sampled (37.5 ms unsampled)" in t
    assert "| key sketch: scores | 25.0% | 10.0 |" in t
    assert '"method": "block"' in t


def test_scsa_is_sampled_once_calibrated():
    assert profile.warmup_steps(["--sparse-attn", "on"]) == 8
    assert profile.warmup_steps(["--sparse-attn", "scsa"]) == 8 + 32
    assert profile.warmup_steps(["--sparse-attn", "scsa", "--scsa-calib-steps", "16"]) == 8 + 16


def test_a_saved_prompt_serves_only_runs_whose_prefill_writes_the_same_cache():
    from pathlib import Path
    m = Path("/models/SmolLM2.gguf")
    yarn = ["--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "8192"]
    block = profile.slot_name(m, 32768, yarn + ["--sparse-attn", "on", "--sparse-attn-recheck", "0"])
    scsa = profile.slot_name(m, 32768, yarn + ["--sparse-attn", "scsa", "--scsa-audit-steps", "0"])
    assert block == scsa
    assert profile.slot_name(m, 32768, ["--sparse-attn", "on"]) != block  # no YaRN: another cache
    assert profile.slot_name(m, 32768, yarn + ["--sparse-prefill", "on"]) != block
    assert profile.slot_name(m, 8192, yarn) != profile.slot_name(m, 32768, yarn)


def test_a_sampled_answer_longer_than_the_context_is_refused_before_any_server_starts(tmp_path):
    import pytest
    from llama_sparse.errors import UserError
    with pytest.raises(UserError, match="--n-predict 4096"):
        profile.run("smollm2-135m", 4096, 4096, [], tmp_path, None)
    assert not any(tmp_path.iterdir())


def test_the_sampled_window_opens_at_the_first_streamed_token(tmp_path):
    """complete_streamed() calls back once, at the first event, and returns the last (the one
    with the timings), from a stand-in for llama-server's event stream."""
    import http.server
    import json
    import threading
    from pathlib import Path

    from llama_sparse.server import ServerConfig, ServerProcess

    events = [{"content": "a"}, {"content": "b"}, {"content": "", "stop": True, "timings": {"predicted_n": 2}}]
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for e in events:
                self.wfile.write(b"data: " + json.dumps(e).encode() + b"\n\n")

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = ServerProcess(ServerConfig(model=Path("m.gguf")), tmp_path / "log")
        server.port = httpd.server_address[1]
        calls: list[int] = []
        last = server.complete_streamed([1, 2, 3], 2, on_first_token=lambda: calls.append(len(calls)),
                                        ignore_eos=True)
    finally:
        httpd.shutdown()
    assert calls == [0]
    assert last["timings"] == {"predicted_n": 2}
    assert seen[0]["stream"] is True and seen[0]["ignore_eos"] is True and seen[0]["prompt"] == [1, 2, 3]
    assert seen[0]["temperature"] == 0.0  # the greedy body complete() sends
