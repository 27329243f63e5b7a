"""One table of sparse settings in libllama: every flag of every tool, every LLAMA_SPARSE_*
variable and llama_sparse_params_check take their names, ranges and defaults from it, so a range
is written once and every entry point refuses the same values with the same words."""

from __future__ import annotations

import ctypes
import functools
import re
import subprocess

import pytest

from llama_sparse.binaries import binary, lib_dir
from llama_sparse.python import SparseParams
from startup import refuses

pytestmark = pytest.mark.slow


class _Setting(ctypes.Structure):
    _fields_ = [("flag", ctypes.c_char_p), ("env", ctypes.c_char_p), ("value_hint", ctypes.c_char_p),
                ("accepted", ctypes.c_char_p), ("help", ctypes.c_char_p)]


@functools.lru_cache(maxsize=None)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(lib_dir() / "libllama.so"))
    lib.llama_sparse_n_settings.restype = ctypes.c_size_t
    lib.llama_sparse_setting_get.argtypes = [ctypes.c_size_t]
    lib.llama_sparse_setting_get.restype = ctypes.POINTER(_Setting)
    lib.llama_sparse_default_params.restype = SparseParams
    lib.llama_sparse_params_set.argtypes = [ctypes.POINTER(SparseParams), ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_char_p, ctypes.c_size_t]
    lib.llama_sparse_params_set.restype = ctypes.c_bool
    lib.llama_sparse_params_check.argtypes = [ctypes.POINTER(SparseParams), ctypes.c_char_p, ctypes.c_size_t]
    lib.llama_sparse_params_check.restype = ctypes.c_bool
    lib.llama_sparse_params_size.restype = ctypes.c_size_t
    assert lib.llama_sparse_params_size() == ctypes.sizeof(SparseParams), "the Python mirror and the library differ"
    return lib


def _rows() -> list[dict[str, str | None]]:
    lib = _lib()
    rows = []
    for i in range(lib.llama_sparse_n_settings()):
        r = lib.llama_sparse_setting_get(i).contents
        rows.append({k: (getattr(r, k).decode() if getattr(r, k) is not None else None)
                     for k in ("flag", "env", "value_hint", "accepted", "help")})
    assert not lib.llama_sparse_setting_get(len(rows)), "a row past the end"
    return rows


def _set(params: SparseParams, name: str, value: str) -> tuple[bool, str]:
    err = ctypes.create_string_buffer(512)
    ok = _lib().llama_sparse_params_set(ctypes.byref(params), name.encode(), value.encode(), err, len(err))
    return ok, err.value.decode()


def _check(params: SparseParams) -> tuple[bool, str]:
    err = ctypes.create_string_buffer(512)
    ok = _lib().llama_sparse_params_check(ctypes.byref(params), err, len(err))
    return ok, err.value.decode()


def test_the_table_names_every_setting_once() -> None:
    rows = _rows()
    flags = [r["flag"] for r in rows]
    assert len(flags) == len(set(flags)) and len({r["env"] for r in rows}) == len(rows)
    for r in rows:
        assert r["flag"].startswith(("--sparse-attn", "--sparse-prefill", "--scsa-")), r
        assert r["env"].startswith("LLAMA_SPARSE_"), r
        # the accepted values, and the default where there is one, end every help
        assert re.search(re.escape(f" ({r['accepted']}") + r"(; default: [^;]+)?\)$", r["help"]), r
    by_flag = {r["flag"]: r for r in rows}
    # the struct's coverage 0 is the score's own: the key sketch reads at most half of the blocks
    assert "default: 0.5 with the key sketch, 0.625 with the key bounds)" in by_flag["--sparse-attn-coverage"]["help"]
    assert "(auto, bound or sketch; default: auto)" in by_flag["--sparse-attn-score"]["help"]
    assert "default: 32)" in by_flag["--sparse-attn-block-size"]["help"]
    assert "default: 0.0125)" in by_flag["--scsa-tolerance"]["help"]
    assert by_flag["--scsa-hierarchical"]["value_hint"] is None   # a switch
    assert "(off, on or auto; default: off)" in by_flag["--sparse-prefill"]["help"]
    assert "default: 0.1)" in by_flag["--sparse-prefill-coverage"]["help"]


@pytest.mark.parametrize("tool", ["llama-server", "llama-bench"])
def test_every_tool_offers_every_row(tool: str) -> None:
    out = subprocess.run([str(binary(tool)), "--help"], capture_output=True, text=True, timeout=60)
    text = " ".join((out.stdout + out.stderr).split())
    for r in _rows():
        assert r["flag"] in text, (tool, r["flag"])
        # the help as the table words it (llama-server wraps lines: compare with whitespace folded)
        assert " ".join(r["help"].split()) in text, (tool, r["flag"])


# (name, bad value, the value the field would hold, field): the same refusal through the flag,
# the variable and the struct check
BAD = [
    ("--sparse-attn-block-size", "48", 48, "sparse_attn_block_size"),
    ("--sparse-attn-coverage", "1.5", 1.5, "sparse_attn_coverage"),
    ("--sparse-attn-tolerance", "1.5", 1.5, "sparse_attn_tolerance"),
    ("--sparse-attn-topk", "-1", -1, "sparse_attn_topk"),
    ("--sparse-attn-min-kv", "16777217", 16777217, "sparse_attn_min_kv"),
    ("--scsa-cluster-size", "7", 7, "scsa_cluster_size"),
    ("--scsa-max-error", "11", 11.0, "scsa_max_error"),
    ("--scsa-rebuild-interval", "31", 31, "scsa_rebuild_interval"),
    ("--sparse-prefill-coverage", "0", 0.0, "sparse_prefill_coverage"),
    ("--sparse-prefill-tolerance", "2", 2.0, "sparse_prefill_tolerance"),
]


@pytest.mark.parametrize("flag,text,value,field", BAD, ids=[b[0] for b in BAD])
def test_flag_variable_and_struct_refuse_alike(flag: str, text: str, value, field: str) -> None:
    row = next(r for r in _rows() if r["flag"] == flag)
    accepted = row["accepted"]
    for name in (flag, row["env"]):
        params = _lib().llama_sparse_default_params()
        ok, err = _set(params, name, text)
        assert not ok and err == f"{name} must be {accepted}, got '{text}'", err
    # the struct filled by hand: the check names the field, the flag and the same range
    params = _lib().llama_sparse_default_params()
    params.sparse_attn = 1
    params.method = 1 if flag.startswith("--scsa-") else 0
    setattr(params, field, value)
    ok, err = _check(params)
    assert not ok and err.startswith(f"{field} ({flag}) must be {accepted}, got "), err


def test_a_value_the_flag_accepts_the_check_accepts() -> None:
    for r in _rows():
        params = _lib().llama_sparse_default_params()
        if r["value_hint"] is None:
            value = "1"
        else:
            default = re.search(r"; default: ([^;]+)\)$", r["help"])
            # a default per score ("0.25 with the key sketch, ...") starts with a value the flag takes
            value = default.group(1).split(" with ")[0] if default else "taus.json"
        ok, err = _set(params, r["flag"], value)
        assert ok, (r["flag"], value, err)
        assert _check(params) == (True, ""), r["flag"]


def test_the_method_is_separate_from_when_it_runs() -> None:
    params = _lib().llama_sparse_default_params()
    assert (params.sparse_attn, params.method) == (0, 0)   # off, block
    assert _set(params, "--sparse-attn-method", "scsa")[0]
    assert (params.sparse_attn, params.method) == (0, 1)   # still off: the method says which, not when
    assert _set(params, "--sparse-attn", "on")[0]
    assert (params.sparse_attn, params.method) == (1, 1)
    # "scsa" is short for on with the SCSA method
    params = _lib().llama_sparse_default_params()
    assert _set(params, "LLAMA_SPARSE_ATTN", "scsa")[0]
    assert (params.sparse_attn, params.method) == (1, 1)
    # auto is the block method's: SCSA calibrates on its first decode steps and runs on
    assert _set(params, "--sparse-attn", "auto")[0]
    ok, err = _check(params)
    assert not ok and "auto applies to the block method" in err
    # the other method's settings are not checked: a block setting out of range does not refuse SCSA
    params = _lib().llama_sparse_default_params()
    params.sparse_attn, params.method, params.sparse_attn_block_size = 1, 1, 48
    assert _check(params) == (True, "")
    params.method = 0
    assert not _check(params)[0]


def test_a_refused_text_leaves_the_params_as_they_were() -> None:
    params = _lib().llama_sparse_default_params()
    before = bytes(params)
    assert not _set(params, "--sparse-attn-block-size", "48")[0]
    assert not _set(params, "--no-such-setting", "1")[0]
    assert bytes(params) == before


# -- refused at start-up ------------------------------------------------------------------------
# Every tool that takes the table's flags, started with a value or a combination it must refuse:
# it exits non-zero with the table's words, "<flag> must be <accepted>, got '<value>'".

TOOLS = ("llama-server", "llama-cli", "llama-bench")

# (flag, value, what it must be)
OUT_OF_RANGE = [
    ("--sparse-attn", "maybe", "off, on, auto or scsa"),
    ("--sparse-attn-method", "quest", "block or scsa"),
    ("--sparse-attn-block-size", "48", "a multiple of 32 in [32, 4096]"),
    ("--sparse-attn-block-size", "8192", "a multiple of 32 in [32, 4096]"),
    ("--sparse-attn-block-size", "4128", "a multiple of 32 in [32, 4096]"),
    ("--sparse-attn-block-size", "0", "a multiple of 32 in [32, 4096]"),
    ("--sparse-attn-topk", "1048577", "an integer in [0, 1048576]"),
    ("--sparse-attn-topk", "-1", "an integer in [0, 1048576]"),
    ("--sparse-attn-coverage", "0", "a number in (0, 1]"),
    ("--sparse-attn-coverage", "1.5", "a number in (0, 1]"),
    ("--sparse-attn-coverage", "half", "a number in (0, 1]"),
    ("--sparse-attn-tolerance", "-0.01", "a number in [0, 1]"),
    ("--sparse-attn-tolerance", "1.5", "a number in [0, 1]"),
    ("--sparse-attn-tolerance", "nan", "a number in [0, 1]"),
    ("--sparse-attn-recheck", "-0.1", "a number in [0, 100]"),
    ("--sparse-attn-recheck", "101", "a number in [0, 100]"),
    ("--sparse-attn-recheck", "nan", "a number in [0, 100]"),
    ("--sparse-attn-recent", "-1", "an integer in [0, 1048576]"),
    ("--sparse-attn-recent", "1048577", "an integer in [0, 1048576]"),
    ("--sparse-attn-recent", "x", "an integer in [0, 1048576]"),
    ("--sparse-attn-sink", "1048577", "an integer in [0, 1048576]"),
    ("--sparse-attn-sink", "-4", "an integer in [0, 1048576]"),
    ("--sparse-attn-min-kv", "16777217", "an integer in [0, 16777216]"),
    ("--sparse-attn-min-kv", "-1", "an integer in [0, 16777216]"),
    ("--scsa-tolerance", "0", "a number in (0, 1]"),
    ("--scsa-tolerance", "1.5", "a number in (0, 1]"),
    ("--scsa-tolerance", "low", "a number in (0, 1]"),
    ("--scsa-max-error", "0", "a number in (0, 10]"),
    ("--scsa-max-error", "10.5", "a number in (0, 10]"),
    ("--scsa-max-error", "half", "a number in (0, 10]"),
    ("--scsa-calib-steps", "-1", "an integer in [0, 4096]"),
    ("--scsa-calib-steps", "4097", "an integer in [0, 4096]"),
    ("--scsa-packed", "q4_0", "q8_0 or f16"),
    ("--scsa-cluster-size", "7", "an integer in [8, 4096]"),
    ("--scsa-cluster-size", "4097", "an integer in [8, 4096]"),
    ("--scsa-rebuild-interval", "31", "an integer in [32, 65536]"),
    ("--scsa-rebuild-interval", "65537", "an integer in [32, 65536]"),
    ("--scsa-block-size", "31", "an integer in [32, 1048576]"),
    ("--scsa-block-size", "1048577", "an integer in [32, 1048576]"),
    ("--scsa-sink", "-1", "an integer in [0, 65536]"),
    ("--scsa-sink", "65537", "an integer in [0, 65536]"),
    ("--scsa-recent", "-1", "an integer in [0, 65536]"),
    ("--scsa-recent", "65537", "an integer in [0, 65536]"),
    ("--scsa-taus", "", "a file name"),
    ("--sparse-prefill", "yes", "off, on or auto"),
    ("--sparse-prefill-coverage", "1.5", "a number in (0, 1]"),
    ("--sparse-prefill-tolerance", "-0.5", "a number in [0, 1]"),
]

# (args, message): settings each in range, refused together, by llama_sparse_params_check (the
# first two) or by the tools (a method that needs flash attention, with it off)
COMBINATIONS = [
    (["--sparse-attn", "auto", "--sparse-attn-method", "scsa"],
     "sparse_attn (--sparse-attn) auto applies to the block method; SCSA runs on"),
    (["--sparse-attn", "scsa", "--scsa-block-size", "1000"],
     "scsa_block_size (--scsa-block-size) must be a multiple of scsa_rebuild_interval (--scsa-rebuild-interval, 512), got 1000"),
    (["--sparse-attn", "on", "--sparse-attn-min-kv", "0", "-fa", "off"], "--sparse-attn needs flash attention, but --flash-attn is off"),
    (["--sparse-attn", "scsa", "-fa", "off"], "--sparse-attn needs flash attention, but --flash-attn is off"),
    (["--sparse-prefill", "on", "-fa", "off"], "--sparse-prefill needs flash attention, but --flash-attn is off"),
    (["--sparse-attn", "scsa", "--sparse-prefill", "on"],
     "sparse_prefill (--sparse-prefill) reads the block method's key sketch, which SCSA does not keep"),
]

# (variables, message): llama-server's LLAMA_ARG_* mirrors of the flags refuse in the same words
ENVIRONMENT = [
    ({"LLAMA_ARG_SPARSE_ATTN_COVERAGE": "2"}, "--sparse-attn-coverage must be a number in (0, 1], got '2'"),
    ({"LLAMA_ARG_SPARSE_ATTN_BLOCK_SIZE": "33"}, "--sparse-attn-block-size must be a multiple of 32 in [32, 4096], got '33'"),
    ({"LLAMA_ARG_SCSA_TOLERANCE": "2"}, "--scsa-tolerance must be a number in (0, 1], got '2'"),
]

REFUSED = [
    *(pytest.param(tool, args, {}, message, id=f"{tool} {' '.join(args)}")
      for tool in TOOLS
      for args, message in [([flag, value], f"{flag} must be {accepted}, got '{value}'")
                            for flag, value, accepted in OUT_OF_RANGE] + COMBINATIONS),
    *(pytest.param("llama-server", [], env, message, id="llama-server " + " ".join(f"{k}={v}" for k, v in env.items()))
      for env, message in ENVIRONMENT),
]


@pytest.mark.parametrize("tool,args,env,message", REFUSED)
def test_refused_at_startup_in_the_tables_words(tool: str, args: list[str], env: dict[str, str], message: str,
                                                tiny_qwen3) -> None:
    assert message in refuses(tool, tiny_qwen3, args, env)
