"""The DSO: shared libraries that drop in under programs built against upstream's headers, the
LLAMA_SPARSE_* switch that needs no code, and llama-cpp-python on top of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_sparse.binaries import DSO_NAMES, binary, lib_dir

pytestmark = pytest.mark.slow


def _env_without_sparse(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("LLAMA_SPARSE_") and k not in ("LLAMA_SPARSE_CACHE", "LLAMA_SPARSE_ROOT"))}
    env.update(extra)
    return env


def _ldd(path: Path) -> dict[str, str]:
    out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
    resolved = {}
    for line in out.splitlines():
        if "=>" in line:
            name, _, rest = line.strip().partition(" => ")
            resolved[name] = rest.split(" (")[0].strip()
    return resolved


def test_the_build_ships_the_shared_libraries_the_executables_use() -> None:
    libs = lib_dir()
    for name in DSO_NAMES:
        assert (libs / name).exists(), f"{name} missing from {libs}"
    resolved = _ldd(binary("llama-server"))
    assert Path(resolved["libllama.so"]).resolve().parent == libs.resolve()
    assert not [n for n, where in resolved.items() if where == "not found"], resolved


def test_the_installed_layout_finds_its_libraries_through_its_rpath(project, tmp_path: Path) -> None:
    """What `pip install .` puts in the wheel (the same install rules, run on the build folder):
    executables under llama_sparse/bin that load the libraries under llama_sparse/lib, not the
    build folder's."""
    build = project.root / "build" / "patched"
    subprocess.run(["cmake", "--install", str(build), "--component", "llama_sparse", "--prefix", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    installed_lib = tmp_path / "llama_sparse" / "lib"
    for name in DSO_NAMES:
        assert (installed_lib / name).exists(), f"{name} not installed"
    server = tmp_path / "llama_sparse" / "bin" / "llama-server"
    resolved = _ldd(server)
    assert Path(resolved["libllama.so"]).resolve().parent == installed_lib.resolve(), resolved
    # one file per library: a wheel (a zip) would turn SONAME symlinks into copies
    assert not [p.name for p in installed_lib.iterdir() if ".so." in p.name or p.is_symlink()]
    version = subprocess.run([str(server), "--version"], capture_output=True, text=True, env=_env_without_sparse())
    assert version.returncode == 0 and "llama-sparse" in version.stdout + version.stderr


# -- the environment switch, through a program that gives no sparse flag ------------------------

def _logits_run(tiny_qwen3: Path, tmp_path: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The quick brown fox jumps over the lazy dog. " * 8)
    return subprocess.run([str(binary("llama-sparse-logits")), "-m", str(tiny_qwen3), "-f", str(prompt), "-c", "512",
                           "--dump-steps", "2", "--dump-out", str(tmp_path / "out.bin"), "-lv", "4", *flags],
                          capture_output=True, text=True, env=env, timeout=300)


def test_the_environment_switches_sparse_attention_on_without_a_flag(tiny_qwen3: Path, tmp_path: Path) -> None:
    proc = _logits_run(tiny_qwen3, tmp_path, _env_without_sparse(LLAMA_SPARSE_ATTN="on", LLAMA_SPARSE_ATTN_COVERAGE="0.5"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "switched on by LLAMA_SPARSE_ATTN=on LLAMA_SPARSE_ATTN_COVERAGE=0.5" in proc.stderr
    assert "sparse_attn           = on (key sketch, block tail, block 32, coverage 0.5" in proc.stderr
    # logged once, at warning level, however many contexts the program makes
    assert proc.stderr.count("switched on by") == 1


def test_on_alone_is_the_key_sketch_at_half_on_the_cpu(tiny_qwen3: Path, tmp_path: Path) -> None:
    """The defaults are the product: `on` and nothing else resolves, for a CPU KV cache, to the key
    sketch reading at most half of the blocks, stopping at a tolerance of 0.03 (no floor); asking for the
    bounds gives them their own coverage and no tolerance."""
    proc = _logits_run(tiny_qwen3, tmp_path, _env_without_sparse(), "--sparse-attn", "on", "--sparse-attn-min-kv", "0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sparse_attn           = on (key sketch, block tail, block 32, coverage 0.5, tolerance 0.03, sink" in proc.stderr
    proc = _logits_run(tiny_qwen3, tmp_path, _env_without_sparse(), "--sparse-attn", "on", "--sparse-attn-min-kv", "0", "--sparse-attn-score", "bound")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sparse_attn           = on (key bounds, block 32, coverage 0.625, sink" in proc.stderr


def test_a_flag_wins_over_the_environment(tiny_qwen3: Path, tmp_path: Path) -> None:
    proc = _logits_run(tiny_qwen3, tmp_path, _env_without_sparse(LLAMA_SPARSE_ATTN="on"), "--sparse-attn-coverage", "0.75")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a sparse flag was given: the flags' settings, sparse off unless --sparse-attn says otherwise
    assert "switched on by" not in proc.stderr
    assert "sparse_attn           =" not in proc.stderr


def test_without_the_variables_nothing_is_switched_on(tiny_qwen3: Path, tmp_path: Path) -> None:
    proc = _logits_run(tiny_qwen3, tmp_path, _env_without_sparse())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "llama-sparse:" not in proc.stderr and "sparse_attn           =" not in proc.stderr


BAD_ENVIRONMENT = [
    ({"LLAMA_SPARSE_ATTN": "sideways"}, "LLAMA_SPARSE_ATTN must be off, on, auto or scsa, got 'sideways'"),
    ({"LLAMA_SPARSE_ATTN": "on", "LLAMA_SPARSE_ATTN_COVERAGE": "2"}, "LLAMA_SPARSE_ATTN_COVERAGE must be a number in (0, 1], got '2'"),
    ({"LLAMA_SPARSE_ATTN": "on", "LLAMA_SPARSE_ATTN_COVERAGE": "0,5"}, "LLAMA_SPARSE_ATTN_COVERAGE must be a number in (0, 1], got '0,5'"),
    ({"LLAMA_SPARSE_ATTN": "on", "LLAMA_SPARSE_ATTN_BLOCK_SIZE": "48"}, "LLAMA_SPARSE_ATTN_BLOCK_SIZE must be a multiple of 32 in [32, 4096], got '48'"),
    ({"LLAMA_SPARSE_ATTN": "on", "LLAMA_SPARSE_ATTN_TOPK": "-1"}, "LLAMA_SPARSE_ATTN_TOPK must be an integer in [0, 1048576], got '-1'"),
    ({"LLAMA_SPARSE_ATTN": "scsa", "LLAMA_SPARSE_SCSA_TOLERANCE": "nan"}, "LLAMA_SPARSE_SCSA_TOLERANCE must be a number in (0, 1], got 'nan'"),
    ({"LLAMA_SPARSE_ATTN": "scsa", "LLAMA_SPARSE_SCSA_PACKED": "q4_0"}, "LLAMA_SPARSE_SCSA_PACKED must be q8_0 or f16, got 'q4_0'"),
    ({"LLAMA_SPARSE_ATTN": "scsa", "LLAMA_SPARSE_SCSA_CALIB_STEPS": "99999999999"}, "LLAMA_SPARSE_SCSA_CALIB_STEPS must be an integer in [0, 4096], got '99999999999'"),
    ({"LLAMA_SPARSE_ATTN": "scsa", "LLAMA_SPARSE_SCSA_BLOCK_SIZE": "1000"},
     "the LLAMA_SPARSE_* environment (LLAMA_SPARSE_ATTN=scsa LLAMA_SPARSE_SCSA_BLOCK_SIZE=1000): scsa_block_size (--scsa-block-size) "
     "must be a multiple of scsa_rebuild_interval (--scsa-rebuild-interval, 512)"),
    ({"LLAMA_SPARSE_ATTN_METHOD": "quest"}, "LLAMA_SPARSE_ATTN_METHOD must be block or scsa, got 'quest'"),
    ({"LLAMA_SPARSE_ATTN": "auto", "LLAMA_SPARSE_ATTN_METHOD": "scsa"},
     "sparse_attn (--sparse-attn) auto applies to the block method; SCSA runs on"),
]


@pytest.mark.parametrize("variables,message", BAD_ENVIRONMENT, ids=[" ".join(f"{k}={v}" for k, v in e.items()) for e, _ in BAD_ENVIRONMENT])
def test_a_bad_variable_is_refused_by_name_with_no_crash(variables: dict[str, str], message: str, tiny_qwen3: Path,
                                                         tmp_path: Path) -> None:
    proc = _logits_run(tiny_qwen3, tmp_path, _env_without_sparse(**variables))
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr[-2000:]}"   # refused, not a signal
    assert message in proc.stderr
    assert "failed to load the model" in proc.stderr   # the context was never made: no silent dense run


# -- llama-cpp-python on the DSO -----------------------------------------------------------------

def _need_llama_cpp_python() -> None:
    from llama_sparse.bindings import installed_version

    if installed_version() is None:
        pytest.fail("llama-cpp-python is not installed: run `llama-sparse python-bindings install` (scripts/setup.sh --tests does)")


@pytest.mark.parametrize("sparse", [None, "on", "scsa"])
def test_llama_cpp_pythons_own_vocab_tests_pass_on_our_dso(project, sparse: str | None) -> None:
    from llama_sparse import bindings

    _need_llama_cpp_python()
    run = bindings.run_tests(project, lib_dir(), {"LLAMA_SPARSE_ATTN": sparse} if sparse else {})
    assert run.returncode == 0 and run.failed == 0, run.output[-4000:]
    assert run.passed >= 8, run.output[-2000:]   # the tokenization test among them runs the native library


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=_env_without_sparse(LLAMA_CPP_LIB_PATH=str(lib_dir()), **env))


def test_sparse_off_is_bit_identical_to_upstreams_dso_and_sparse_reads_less(tiny_qwen3: Path, tmp_path: Path) -> None:
    """The python-check on the tiny model: llama_cpp.Llama on our DSO, sparse off, gives the
    logits of upstream's DSO bit for bit; on and SCSA run through the same Llama API, and the one
    statistics call reports what they read."""
    _need_llama_cpp_python()
    proc = subprocess.run([sys.executable, "-m", "llama_sparse", "python-check", "--model", str(tiny_qwen3),
                           "--context", "4608", "--steps", "8", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=_env_without_sparse())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(next(tmp_path.glob("python-check-*.json")).read_text())
    assert result["identical_rows"] == result["compared_rows"] == 9
    runs = {(("upstream" if r["upstream"] else "ours"), r["mode"]): r for r in result["runs"]}
    assert set(runs) == {("upstream", "off"), ("ours", "off"), ("ours", "on"), ("ours", "scsa")}
    on, scsa = runs[("ours", "on")], runs[("ours", "scsa")]
    assert on["stats"]["mode"] == "on" and on["stats"]["blocks_visible"] > 0
    # the selection reads at most its ceiling, half of the blocks (a random model's attention is
    # flat, so every walk reaches it); a step computed again densely (the recheck: a random
    # model's steps are all in doubt) adds its visible blocks, about 1/steps_sparse each, which
    # this subtraction only approximates
    assert on["stats"]["steps_sparse"] > 0
    rechecked = on["stats"]["steps_rechecked"] / on["stats"]["steps_sparse"]
    assert 0.0 < on["read_fraction"] - rechecked < 0.6, (on["read_fraction"], rechecked)
    assert scsa["stats"]["mode"] == "scsa" and scsa["stats"]["scsa_visible_rows"] > 0
    assert scsa["stats"]["scsa_calibrated"]


def test_bad_settings_through_the_api_are_refused_by_name(tiny_qwen3: Path) -> None:
    code = f"""
import ctypes, sys
from llama_sparse.python import make_params, sparse_llama, _library, SparseParams
import llama_cpp
try:
    sparse_llama({str(tiny_qwen3)!r}, sparse=make_params("on", sparse_attn_coverage=2.0), n_ctx=256, verbose=False)
    print("NOT REFUSED coverage")
except ValueError as e:
    print("refused:", e)
try:
    make_params("sideways")
except ValueError as e:
    print("refused:", e)
lib = _library()
p = make_params("scsa", scsa_cluster_size=4)
err = ctypes.create_string_buffer(256)
lib.llama_sparse_params_check.argtypes = [ctypes.POINTER(SparseParams), ctypes.c_char_p, ctypes.c_size_t]
lib.llama_sparse_params_check.restype = ctypes.c_bool
print("check:", lib.llama_sparse_params_check(ctypes.byref(p), err, len(err)), err.value.decode())
p.sparse_attn = 7
print("check:", lib.llama_sparse_params_check(ctypes.byref(p), err, len(err)), err.value.decode())
# the explicit entry point, with a model llama_cpp loaded: a NULL context, never a crash
llm = llama_cpp.Llama({str(tiny_qwen3)!r}, n_ctx=256, flash_attn=True, verbose=True)   # verbose: the log reaches stderr
lib.llama_sparse_init_from_model.argtypes = [ctypes.c_void_p, llama_cpp.llama_context_params, ctypes.POINTER(SparseParams)]
lib.llama_sparse_init_from_model.restype = ctypes.c_void_p
bad = make_params("on", sparse_attn_block_size=48)
print("init:", lib.llama_sparse_init_from_model(llm.model, llama_cpp.llama_context_default_params(), ctypes.byref(bad)))
"""
    _need_llama_cpp_python()
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "refused: sparse_attn_coverage (--sparse-attn-coverage) must be a number in (0, 1], got 2" in out
    assert "refused: sparse mode must be one of off, on, auto, scsa, got 'sideways'" in out
    assert "check: False scsa_cluster_size (--scsa-cluster-size) must be an integer in [8, 4096], got 4" in out
    assert "check: False sparse_attn (--sparse-attn) must be off, on, auto or scsa, got 7" in out
    assert "init: None" in out
    assert "sparse_attn_block_size (--sparse-attn-block-size) must be a multiple of 32 in [32, 4096], got 48" in proc.stderr


def test_a_bad_variable_under_llama_cpp_python_fails_the_llama_with_the_reason(tiny_qwen3: Path) -> None:
    _need_llama_cpp_python()
    code = f"""
import llama_cpp
try:
    # verbose: llama_cpp silences the library's log otherwise, the reason with it
    llama_cpp.Llama({str(tiny_qwen3)!r}, n_ctx=256, verbose=True)
    print("NOT REFUSED")
except ValueError as e:
    print("refused:", e)
"""
    proc = _python(code, LLAMA_SPARSE_ATTN="on", LLAMA_SPARSE_ATTN_SINK="many")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused:" in proc.stdout
    assert "LLAMA_SPARSE_ATTN_SINK must be an integer in [0, 1048576], got 'many'" in proc.stderr


def test_scsa_from_the_environment_gets_the_one_slot_it_needs(tiny_qwen3: Path, tmp_path: Path) -> None:
    """llama-server with no flag at all and LLAMA_SPARSE_ATTN=scsa: the automatic slot count
    becomes 1 (as with --sparse-attn scsa) instead of a refused context."""
    import time

    from llama_sparse.server import free_port

    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(binary("llama-server")), "-m", str(tiny_qwen3), "-c", "1024", "--port", str(free_port()),
                                 "--no-webui", "-lv", "4"], stdout=out, stderr=subprocess.STDOUT,
                                env=_env_without_sparse(LLAMA_SPARSE_ATTN="scsa"))
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and proc.poll() is None and "llama_server: listening on" not in log.read_text():
                time.sleep(0.5)
            text = log.read_text()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert "llama_server: listening on" in text, text[-3000:]
    assert "sparse_attn           = scsa" in text
    assert "n_seq_max             = 1" in text
    assert "switched on by LLAMA_SPARSE_ATTN=scsa" in text


def test_the_statistics_of_a_sequence_the_context_lacks_are_refused_not_aborted(tiny_qwen3: Path) -> None:
    """llama_sparse_get_stats with a seq_id past the context's sequences returns false (before: SCSA
    with a KV stream per sequence looked the stream up with GGML_ASSERT and aborted the process)."""
    _need_llama_cpp_python()
    code = f"""
import ctypes
from llama_sparse.python import make_params, _library, _SparseStats
import llama_cpp
lib = _library()
model = llama_cpp.llama_model_load_from_file({str(tiny_qwen3)!r}.encode(), llama_cpp.llama_model_default_params())
lib.llama_sparse_init_from_model.argtypes = [ctypes.c_void_p, llama_cpp.llama_context_params, ctypes.c_void_p]
lib.llama_sparse_init_from_model.restype = ctypes.c_void_p
for mode in ("scsa", "on"):
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_seq_max, cparams.kv_unified = 1024, 4, False
    cparams.flash_attn_type = 1
    params = make_params(mode)
    ctx = lib.llama_sparse_init_from_model(model, cparams, ctypes.byref(params))
    assert ctx, mode
    out = _SparseStats()
    for seq in (-1, 0, 3, 4, 1000, -2):
        print(mode, seq, lib.llama_sparse_get_stats(ctx, seq, ctypes.byref(out), False), flush=True)
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for mode in ("scsa", "on"):
        for seq, ok in ((-1, True), (0, True), (3, True), (4, False), (1000, False), (-2, False)):
            assert f"{mode} {seq} {ok}" in proc.stdout, proc.stdout


def test_a_prompt_llama_cpp_python_replays_from_its_cache_is_read_as_a_prompt(tiny_qwen3: Path, tmp_path: Path) -> None:
    """llama-cpp-python's generate() replays the last token of a prompt it finds whole in its cache
    behind a longer one, alone in its batch, for its logits. sparse_llama's Llama marks that eval a
    prompt's (llama_sparse_set_seq_prompt): the row is read densely, so the replay counts no sparse
    step and its logits are a dense Llama's after the same calls, bit for bit (the recheck off, so
    a sparse row would stay sparse)."""
    _need_llama_cpp_python()
    code = f"""
import numpy as np
from llama_sparse.python import make_params, read_stats, sparse_llama
import llama_cpp
prompt = [20 + (7*i) % 250 for i in range(1200)]   # ids within the tiny vocabulary (282)
for mode in ("off", "on"):
    params = make_params(mode, sparse_attn_min_kv=0, sparse_attn_coverage=0.25, sparse_attn_recheck=0)
    llm = sparse_llama({str(tiny_qwen3)!r}, sparse=params, n_ctx=2048, verbose=False)
    llm.create_completion(prompt, max_tokens=4, temperature=0.0)    # the cache holds more than the prompt
    read_stats(llm, reset=True)
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)    # the prompt found whole: its last token replayed
    assert llm.n_tokens == len(prompt), llm.n_tokens
    logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)   # the replayed row's, the last decoded
    np.save(f"{{mode}}.npy", np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).copy())
    print(mode, "steps_sparse", read_stats(llm).steps_sparse, flush=True)
print("identical", bool(np.array_equal(np.load("off.npy"), np.load("on.npy"))))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=_env_without_sparse(LLAMA_CPP_LIB_PATH=str(lib_dir())))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "on steps_sparse 0" in proc.stdout, proc.stdout
    assert "identical True" in proc.stdout, proc.stdout
