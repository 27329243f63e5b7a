"""Sparse attention for llama-cpp-python: a `llama_cpp.Llama` on our DSO with sparse attention or
SCSA switched on, and its read statistics.

llama-cpp-python loads the libllama.so that `LLAMA_CPP_LIB_PATH` names (`llama-sparse lib-path`
prints ours). Our settings travel beside upstream's `llama_context_params`, which is unchanged,
through llama-sparse.h's own functions; this module reaches them with ctypes on the same library
file, so it needs nothing of llama-cpp-python but its public API:

    from llama_sparse.python import sparse_llama, read_stats
    llm = sparse_llama("model.gguf", "on", n_ctx=8192)   # or "scsa"; keyword arguments go to Llama
    ...; print(read_stats(llm).read_fraction)

Without code, `LLAMA_SPARSE_ATTN=on` in the environment does the same for any program on the DSO.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# a mode as the --sparse-attn flag names it: (when, which) of llama_sparse_params
MODES = {"off": (0, 0), "on": (1, 0), "auto": (2, 0), "scsa": (1, 1)}
GGML_TYPE_F16 = 1
GGML_TYPE_Q8_0 = 8


class SparseParams(ctypes.Structure):
    """`struct llama_sparse_params` (llama-sparse.h); its size is checked against the library's."""

    _fields_ = [
        ("sparse_attn", ctypes.c_int),
        ("method", ctypes.c_int),
        ("sparse_attn_block_size", ctypes.c_int32),
        ("sparse_attn_topk", ctypes.c_int32),
        ("sparse_attn_coverage", ctypes.c_float),
        ("sparse_attn_recent", ctypes.c_int32),
        ("sparse_attn_sink", ctypes.c_int32),
        ("sparse_attn_min_kv", ctypes.c_int32),
        ("scsa_tolerance", ctypes.c_float),
        ("scsa_max_error", ctypes.c_float),
        ("scsa_calib_steps", ctypes.c_int32),
        ("scsa_taus", ctypes.c_char_p),
        ("scsa_taus_out", ctypes.c_char_p),
        ("scsa_hierarchical", ctypes.c_bool),
        ("scsa_packed", ctypes.c_int),
        ("scsa_cluster_size", ctypes.c_int32),
        ("scsa_rebuild_interval", ctypes.c_int32),
        ("scsa_block_size", ctypes.c_int32),
        ("scsa_sink", ctypes.c_int32),
        ("scsa_recent", ctypes.c_int32),
        ("sparse_attn_score", ctypes.c_int),  # API version 4: 0 key bounds, 1 key sketch; 5: 2 auto (the default)
        ("sparse_attn_tolerance", ctypes.c_float),  # API version 6: the key sketch's, 0 reads the whole coverage, -1 the score's own
        ("sparse_attn_recheck", ctypes.c_float),  # API version 7: a step within this logit gap computed again densely, -1 the method's own
        ("sparse_prefill", ctypes.c_int),  # API version 8: 0 off, 1 on, 2 auto (prompts through the key sketch's selection)
        ("sparse_prefill_coverage", ctypes.c_float),
        ("sparse_prefill_tolerance", ctypes.c_float),
        ("scsa_audit_steps", ctypes.c_int32),  # API version 9: exact steps after each prompt that lower erring taus
    ]


class _SparseStats(ctypes.Structure):
    """`struct llama_sparse_stats` (llama-sparse.h)."""

    _fields_ = [
        ("sparse_attn", ctypes.c_int),
        ("method", ctypes.c_int),
        ("blocks_read", ctypes.c_uint64),
        ("blocks_visible", ctypes.c_uint64),
        ("scsa_calls", ctypes.c_int64),
        ("scsa_scored", ctypes.c_int64),
        ("scsa_opened_rows", ctypes.c_int64),
        ("scsa_exact_rows", ctypes.c_int64),
        ("scsa_visible_rows", ctypes.c_int64),
        ("scsa_rebuilds", ctypes.c_int64),
        ("scsa_dense_calls", ctypes.c_int64),
        ("scsa_calib_steps", ctypes.c_int32),
        ("scsa_calibrated", ctypes.c_bool),
        ("scsa_plan_bytes", ctypes.c_int64),
        ("read_fraction", ctypes.c_double),
        ("steps_sparse", ctypes.c_uint64),      # API version 7
        ("steps_rechecked", ctypes.c_uint64),
        ("prefill_blocks_read", ctypes.c_uint64),     # API version 8
        ("prefill_blocks_visible", ctypes.c_uint64),
        ("scsa_audit_steps", ctypes.c_int64),         # API version 9
        ("scsa_taus_tightened", ctypes.c_int64),
    ]


@dataclass(frozen=True)
class SparseStats:
    """What a context read in its decode steps against what dense attention would have read."""

    mode: str                # off, on, auto or scsa
    read_fraction: float     # of what dense reads: blocks (block method) or rows (SCSA); 1.0 when nothing counted
    blocks_read: int
    blocks_visible: int
    scsa_opened_rows: int
    scsa_exact_rows: int
    scsa_visible_rows: int
    scsa_calib_steps: int
    scsa_calibrated: bool
    steps_sparse: int = 0        # block method: decode steps read sparsely, and of those
    steps_rechecked: int = 0     # the steps computed again densely (--sparse-attn-recheck)


class SparseLibraryError(RuntimeError):
    """The library llama-cpp-python loads is not ours (or not this version of ours)."""


def library_path() -> Path:
    """The libllama.so llama-cpp-python loads: `LLAMA_CPP_LIB_PATH`'s, else ours (set it then)."""
    folder = os.environ.get("LLAMA_CPP_LIB_PATH")
    if not folder:
        from llama_sparse.binaries import lib_dir

        folder = str(lib_dir())
        # llama_cpp reads the variable at its import: set before it is imported, it takes ours
        os.environ["LLAMA_CPP_LIB_PATH"] = folder
    return Path(folder) / "libllama.so"


def _loaded_libllama() -> set[str]:
    """The libllama files mapped in this process (Linux): more than one means llama_cpp took another."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {os.path.realpath(line.split()[-1]) for line in maps.splitlines()
            if "/libllama.so" in line and line.split()[-1].startswith("/")}


def _library() -> ctypes.CDLL:
    return _open(library_path())


@functools.lru_cache(maxsize=None)
def _open(path: Path) -> ctypes.CDLL:
    # the same file llama_cpp opened: dlopen hands back that library, so these functions act on
    # the very contexts llama_cpp creates
    lib = ctypes.CDLL(str(path))
    try:
        lib.llama_sparse_params_size.restype = ctypes.c_size_t
    except AttributeError as e:
        raise SparseLibraryError(f"{path} has no llama-sparse API (an upstream build?): "
                                 f"set LLAMA_CPP_LIB_PATH to `llama-sparse lib-path`") from e
    if lib.llama_sparse_params_size() != ctypes.sizeof(SparseParams):
        raise SparseLibraryError(f"{path}: llama_sparse_params is {lib.llama_sparse_params_size()} bytes, this module "
                                 f"knows {ctypes.sizeof(SparseParams)}: the library and the Python package differ in version")
    loaded = _loaded_libllama()
    if len(loaded) > 1:
        raise SparseLibraryError(f"two libllama files are loaded ({', '.join(sorted(loaded))}): llama_cpp was imported "
                                 f"before LLAMA_CPP_LIB_PATH named ours ({path.parent})")
    lib.llama_sparse_default_params.restype = SparseParams
    lib.llama_sparse_set_process_params.argtypes = [ctypes.POINTER(SparseParams), ctypes.c_char_p, ctypes.c_size_t]
    lib.llama_sparse_set_process_params.restype = ctypes.c_bool
    lib.llama_sparse_get_stats.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.POINTER(_SparseStats), ctypes.c_bool]
    lib.llama_sparse_get_stats.restype = ctypes.c_bool
    lib.llama_sparse_get_params.argtypes = [ctypes.c_void_p]
    lib.llama_sparse_get_params.restype = SparseParams
    lib.llama_sparse_set_seq_prompt.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_bool]
    lib.llama_sparse_set_seq_prompt.restype = ctypes.c_bool
    return lib


def make_params(mode: str = "on", **settings: Any) -> SparseParams:
    """The library's defaults with `mode` and any field of llama_sparse_params over them, e.g.
    make_params("on", sparse_attn_coverage=0.5) or make_params("scsa", scsa_tolerance=0.025)."""
    if mode not in MODES:
        raise ValueError(f"sparse mode must be one of {', '.join(MODES)}, got {mode!r}")
    params = _library().llama_sparse_default_params()
    params.sparse_attn, params.method = MODES[mode]
    known = {name for name, _ in SparseParams._fields_} - {"sparse_attn", "method"}
    for name, value in settings.items():
        if name not in known:
            raise ValueError(f"unknown sparse setting {name!r}; known: {', '.join(sorted(known))}")
        if name in ("scsa_taus", "scsa_taus_out"):
            if value is not None and not str(value):
                raise ValueError(f"{name} needs a file name (None: none)")
            value = os.fsencode(value) if value is not None else None
        setattr(params, name, value)
    return params


def sparse_llama(model_path: str | os.PathLike, mode: str = "on", *, sparse: SparseParams | None = None,
                 **llama_kwargs: Any):
    """A `llama_cpp.Llama` whose context runs sparse attention (`mode` on/auto/scsa, or `sparse`
    from make_params for other settings). Keyword arguments go to Llama; flash attention, which
    both methods read the cache through, is turned on. A bad setting raises ValueError naming it.

    The settings travel through llama_sparse_set_process_params for the making of this one Llama
    and are cleared after: make Llamas from one thread at a time."""
    params = sparse if sparse is not None else make_params(mode)
    library_path()  # LLAMA_CPP_LIB_PATH set before llama_cpp is imported
    import llama_cpp

    lib = _library()
    err = ctypes.create_string_buffer(512)
    if not lib.llama_sparse_set_process_params(ctypes.byref(params), err, len(err)):
        raise ValueError(err.value.decode())
    try:
        llama_kwargs.setdefault("flash_attn", True)
        return _prompt_marking_llama()(model_path=str(model_path), **llama_kwargs)
    finally:
        # only this Llama's context: later ones follow the environment again
        lib.llama_sparse_set_process_params(None, None, 0)


@functools.lru_cache(maxsize=None)
def _prompt_marking_llama() -> type:
    """llama_cpp.Llama, telling llama which of its rows are a prompt's. llama reads a sequence
    with one token in a batch as a decode step, and generate() can evaluate a prompt's last token
    alone: it replays it for its logits when it finds the whole prompt in its cache behind a longer
    one (or a prompt's last batch holds one token). The first eval of each generate() is the
    prompt's, marked so (llama_sparse_set_seq_prompt, sequence 0, the one Llama decodes), and read
    as a prefill reads it: the answer begins from the row it begins from when the prompt is
    evaluated whole."""
    import llama_cpp

    lib = _library()

    class SparseLlama(llama_cpp.Llama):
        _prompt_next = False

        def generate(self, tokens, *args, **kwargs):
            self._prompt_next = True
            return super().generate(tokens, *args, **kwargs)

        def eval(self, tokens) -> None:
            if not self._prompt_next:
                return super().eval(tokens)
            self._prompt_next = False
            lib.llama_sparse_set_seq_prompt(self.ctx, 0, True)
            try:
                return super().eval(tokens)
            finally:
                lib.llama_sparse_set_seq_prompt(self.ctx, 0, False)

    return SparseLlama


def read_stats(llm, seq_id: int = -1, reset: bool = False) -> SparseStats:
    """The sparse statistics of a Llama's context (mode "off" for a dense one)."""
    out = _SparseStats()
    _library().llama_sparse_get_stats(_context(llm), seq_id, ctypes.byref(out), reset)
    values = {f.name: getattr(out, f.name) for f in fields(SparseStats) if f.name != "mode"}
    return SparseStats(mode=_mode_name(out.sparse_attn, out.method), **values)


def context_mode(llm) -> str:
    """What the Llama's context runs: off, on, auto or scsa."""
    params = _library().llama_sparse_get_params(_context(llm))
    return _mode_name(params.sparse_attn, params.method)


def _mode_name(sparse_attn: int, method: int) -> str:
    if sparse_attn == 0:
        return "off"
    return next((name for name, pair in MODES.items() if pair == (sparse_attn, method)), f"unknown ({sparse_attn}, {method})")


def _context(llm) -> int:
    if not getattr(llm, "ctx", None):
        raise ValueError("this Llama has no context (closed?)")
    return llm.ctx
