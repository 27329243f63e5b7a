"""Gate definitions: one YAML file per gate in gates/, loaded into frozen dataclasses.

A gate file looks like this (every key but `kind`, `models`, `context_lengths` and `arms`
is optional)::

    # what the gate checks, in a comment
    kind: niah                      # identity | niah | logits | ab | load | frontier
    description: the dense path still finds the needle at 7K
    models: [smollm2-135m]          # model names, or paths to .gguf files (relative to this file)
    context_lengths: [7168]         # tokens; "8K" means 8192
    cache_types: [f16]              # KV cache type, for K and V alike
    samples: 24
    tasks: [niah_single_1]          # niah only
    n_predict: 128
    arms:
      - dense                       # shorthand for {name: dense}
      - name: sparse-25
        flags: [--sparse-attn, "on", --sparse-attn-coverage, "0.25"]
    thresholds: {min_score: 1.0}

For `identity` and `logits` the first arm is the reference the others are compared with
(`GateSpec.reference`). A `frontier` gate takes a niah gate's keys for its needles (at
`context_lengths`) and measures every arm's decode speed against its first arm, which must be
dense, at `speed_context` (default 8192, `repeats` rounds). Everything is checked when the file is loaded: an unknown key, a
value of the wrong type or out of range, a flag the harness sets itself -- each is refused
with a message that starts with the file (and line) it is in, all problems of a file at once.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from llama_sparse.errors import UserError
from llama_sparse.gates import niah
from llama_sparse.models import MODEL_NAMES as KNOWN_MODELS

KINDS = ("identity", "niah", "logits", "ab", "load", "frontier")
VARIANTS = ("patched", "upstream")
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
NIAH_TASKS = niah.TASKS
MIN_AB_REPEATS = 5
NAME_RE = re.compile(r"^[a-z0-9._-]+$")


@dataclass(frozen=True)
class Threshold:
    """A pass threshold a gate kind understands: its meaning and the range its value may take."""

    help: str
    low: float
    high: float | None = None
    integer: bool = False
    low_open: bool = False   # value must be > low rather than >= low


THRESHOLDS: dict[str, dict[str, Threshold]] = {
    "identity": {
        "max_diff_prompts": Threshold("prompts whose output differs from the reference arm", 0, integer=True),
    },
    "niah": {
        "min_score": Threshold("fraction of needles found, per arm and context", 0, 1),
        "max_lost": Threshold("needles the reference arm found that another arm did not (alone, same "
                              "model, context and cache)", 0, integer=True),
    },
    "logits": {
        "max_kl_mean": Threshold("mean KL divergence from the reference arm, per step", 0),
        "max_kl_max": Threshold("largest KL divergence from the reference arm at any step", 0),
        "min_top1": Threshold("fraction of steps whose top-1 token matches the reference", 0, 1),
        "max_diff_steps": Threshold("steps whose logits differ from the reference at all", 0, integer=True),
    },
    "ab": {
        "min_ratio": Threshold("median decode speed of a sparse arm over the dense one", 0, low_open=True),
        "min_bound_share": Threshold("share of the coverage bound a sparse arm reaches", 0, 1),
    },
    # load passes only with no 5xx, no parse error, no crash, a timing line per request and no
    # needle lost; nothing to tune
    "load": {},
    # frontier sweeps settings on purpose, lossy ones included: it records where each lands
    # (needles kept against speed), it does not judge them
    "frontier": {},
}

# Flags the harness derives from the gate itself; an arm setting them would fight it.
RESERVED_FLAGS = {
    "-m": "models", "--model": "models",
    "-c": "context_lengths", "--ctx-size": "context_lengths",
    "-np": "batch", "--parallel": "batch",
    "-ctk": "cache_types", "--cache-type-k": "cache_types",
    "-ctv": "cache_types", "--cache-type-v": "cache_types",
    "-s": "seed", "--seed": "seed",
    "-t": "threads", "--threads": "threads", "-tb": "threads", "--threads-batch": "threads",
    "-n": "n_predict", "--n-predict": "n_predict", "--predict": "n_predict",
    "--port": "the harness", "--host": "the harness",
}


class SpecError(UserError):
    """A gate file that cannot be used; the message names the file (and line) of every problem."""


@dataclass(frozen=True)
class Arm:
    name: str                       # unique in the file, [a-z0-9._-]+
    flags: tuple[str, ...] = ()     # extra llama-server flags for this arm
    variant: str = "patched"        # which build: patched | upstream
    sparse: bool = False            # uses a sparse method (needs the sparse flags of the build)
    coverage: float | None = None   # block coverage this arm reads (for the bound column), 0<c<=1
    env: tuple[tuple[str, str], ...] = ()  # extra environment of this arm's server (GGML_*, LLAMA_*)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "flags": list(self.flags), "variant": self.variant,
                "sparse": self.sparse, "coverage": self.coverage, "env": dict(self.env)}


@dataclass(frozen=True, kw_only=True)
class GateSpec:
    path: Path
    name: str                                   # defaults to the file stem
    kind: str                                   # identity | niah | logits | ab | load | frontier
    description: str = ""
    models: tuple[str, ...]                     # model names or absolute paths to .gguf files
    context_lengths: tuple[int, ...]            # in tokens
    cache_types: tuple[str, ...] = ("f16",)     # KV cache types (k and v)
    arms: tuple[Arm, ...]
    samples: int = 24                           # niah samples / identity prompts / logits steps
    tasks: tuple[str, ...] = ("niah_single_1",)  # niah only
    repeats: int = 5                            # ab, frontier: >= 5
    speed_context: int = 8192                   # frontier only: the context its speed is measured at
    n_predict: int = 64                         # tokens decoded per request (niah: 128 by default)
    batch: tuple[int, ...] = (1,)               # ab, niah: concurrent streams / requests per arm (--parallel B);
                                                # load: the server's slots (one value)
    clients: int = 8                            # load: concurrent clients
    requests: int = 200                         # load: requests sent under load, at most
    time_limit: float = 900.0                   # load: seconds; no request is sent after it
    skip_steps: int = 0                         # logits only: leading rows left out of the comparison
                                                # (the prefill's row and SCSA's calibration steps)
    calibration_samples: int = 0                # niah only: unscored needle prompts (their own keys,
                                                # values and depths) each arm answers first, so that
                                                # SCSA calibrates on answers that retrieve
    shared_prefill: bool = False                # niah only: each prompt prefilled once, by the first
                                                # arm; every other arm restores that slot and decodes
    stagger: float = 0.0                        # niah only, batch > 1: seconds between request arrivals
                                                # (each on its own client), answer lengths varied
    only_samples: tuple[int, ...] = ()          # niah only: answer just these sample indices (of
                                                # `samples`, each the same prompt as in the full run)
    seed: int = 42
    threads: int | None = None
    thresholds: dict[str, float] = field(default_factory=dict)

    @property
    def reference(self) -> Arm:
        """The arm the others are compared with (identity, logits): the first one."""
        return self.arms[0]

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready, for recording the configuration next to the results."""
        return {
            "path": str(self.path), "name": self.name, "kind": self.kind,
            "description": self.description, "models": list(self.models),
            "context_lengths": list(self.context_lengths), "cache_types": list(self.cache_types),
            "arms": [a.to_dict() for a in self.arms], "samples": self.samples,
            "tasks": list(self.tasks), "repeats": self.repeats, "n_predict": self.n_predict,
            "batch": list(self.batch), "clients": self.clients, "requests": self.requests,
            "time_limit": self.time_limit, "skip_steps": self.skip_steps,
            "calibration_samples": self.calibration_samples, "shared_prefill": self.shared_prefill,
            "only_samples": list(self.only_samples), "stagger": self.stagger, "speed_context": self.speed_context, "seed": self.seed, "threads": self.threads,
            "thresholds": dict(self.thresholds),
        }


# ---------------------------------------------------------------------------------------------
# YAML with line numbers and without silently overwritten duplicate keys

class _Map(dict):
    """A YAML mapping that remembers on which line it and each of its keys stand."""

    line: int = 0
    lines: dict[Any, int]


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    result = _Map()
    result.line = node.start_mark.line + 1
    result.lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark) from None
        if key in result:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {result.lines[key]})",
                key_node.start_mark)
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = key_node.start_mark.line + 1
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _shown(path: Path) -> str:
    """The path as the user would type it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def _read_yaml(path: Path, shown: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"{shown}: cannot read gate file ({e})") from e
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"{shown}:{mark.line + 1}:{mark.column + 1}" if mark else shown
        what = e.problem or "invalid YAML"
        context = ""
        if e.context and e.problem:
            started = e.context_mark
            on = f" on line {started.line + 1}" if started and (not mark or started.line != mark.line) else ""
            context = f" ({e.context}{' started' if on else ''}{on})"
        raise SpecError(f"{where}: YAML error: {what}{context}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{shown}: YAML error: {e}") from None


# ---------------------------------------------------------------------------------------------
# Validation: every check appends to `problems`; load() raises them all at once.

_INVALID = object()  # a value that was refused; checks depending on it are skipped


class _Checker:
    def __init__(self, shown: str) -> None:
        self.shown = shown
        self.problems: list[tuple[int, str]] = []

    def fail(self, line: int | None, msg: str) -> object:
        self.problems.append((line or 0, f"{self.shown}:{line}: {msg}" if line else f"{self.shown}: {msg}"))
        return _INVALID

    def message(self) -> str:
        """All problems, in the order of the lines they are on (file-wide ones first)."""
        return "\n".join(msg for _, msg in sorted(self.problems, key=lambda p: p[0]))

    def unknown_keys(self, data: _Map, known: tuple[str, ...], where: str = "") -> None:
        for key in data:
            if key in known:
                continue
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            self.fail(data.lines.get(key), f"{where}key '{key}' unknown{hint}; known keys: {', '.join(known)}")


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", _Map: "a mapping"}.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_float(value: Any) -> float | None:
    """A number; PyYAML reads `1e-2` (no dot) as a string, so numeric strings count too."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kK])\s*$")


def _context_length(value: Any) -> int | None:
    """A positive token count: an integer, or '8K' for 8192."""
    if _is_int(value):
        return value if value > 0 else None
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            n = float(m.group(1)) * 1024
            return int(n) if n.is_integer() and n > 0 else None
    return None


def _str_list(value: Any) -> list | None:
    """A list, or a single scalar taken as a one-element list."""
    if isinstance(value, list):
        return value
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]
    return None


def _positive_int(ck: _Checker, data: _Map, key: str, minimum: int = 1, reason: str = "") -> Any:
    value = data[key]
    if not _is_int(value):
        return ck.fail(data.lines[key], f"{key}: must be an integer, not {_type_name(value)} ({value!r})")
    if value < minimum:
        return ck.fail(data.lines[key], f"{key}: {value} is out of range (must be >= {minimum}{reason})")
    return value


def _unique_list(ck: _Checker, data: _Map, key: str, item, what: str, allow_scalar: bool = True) -> Any:
    """A non-empty list without duplicates; `item(raw)` returns the value or a reason string."""
    raw = _str_list(data[key]) if allow_scalar else (data[key] if isinstance(data[key], list) else None)
    line = data.lines[key]
    if raw is None:
        return ck.fail(line, f"{key}: must be a list of {what}, not {_type_name(data[key])}")
    if not raw:
        return ck.fail(line, f"{key}: must not be empty")
    out: list = []
    ok = True
    for i, r in enumerate(raw):
        v = item(r)
        if isinstance(v, _Reason):
            ok = False
            ck.fail(line, f"{key}[{i}]: {r!r} {v}")
        elif v in out:
            ok = False
            ck.fail(line, f"{key}[{i}]: {r!r} is listed twice")
        else:
            out.append(v)
    return tuple(out) if ok else _INVALID


class _Reason(str):
    """Why a list item was refused (as opposed to its converted value)."""


def _choice(choices: tuple[str, ...], what: str):
    def check(raw: Any) -> Any:
        if isinstance(raw, str) and raw in choices:
            return raw
        close = difflib.get_close_matches(str(raw), choices, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return _Reason(f"is not a known {what}{hint}; known: {', '.join(choices)}")
    return check


def _model(base: Path):
    def check(raw: Any) -> Any:
        if not isinstance(raw, str) or not raw.strip():
            return _Reason("must be a model name or a path to a .gguf file")
        if raw in KNOWN_MODELS:
            return raw
        if raw.endswith(".gguf"):
            path = Path(raw).expanduser()
            return str(path if path.is_absolute() else (base / path).resolve())
        close = difflib.get_close_matches(raw, KNOWN_MODELS, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return _Reason(f"is not a known model{hint}; known: {', '.join(KNOWN_MODELS)}, "
                       "or a path to a .gguf file")
    return check


def _context_item(raw: Any) -> Any:
    n = _context_length(raw)
    return n if n is not None else _Reason("is not a positive number of tokens (an integer, or e.g. '8K')")


def _index_item(raw: Any) -> Any:
    return raw if _is_int(raw) and raw >= 0 else _Reason("is not a sample index (an integer >= 0)")


def _positive_item(raw: Any) -> Any:
    return raw if _is_int(raw) and raw > 0 else _Reason("is not a positive integer")


# --- arms --------------------------------------------------------------------------------------

ARM_KEYS = ("name", "flags", "variant", "sparse", "coverage", "env")
ENV_NAME_RE = re.compile(r"^(GGML|LLAMA)_[A-Z0-9_]+$")


def flag_value(flags: tuple[str, ...], flag: str) -> str | None:
    """The value given to `flag` (as `--flag v` or `--flag=v`), the last one winning."""
    value = None
    for i, tok in enumerate(flags):
        if tok == flag and i + 1 < len(flags):
            value = flags[i + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


SCSA_CALIB_STEPS = 32   # llama.cpp's default --scsa-calib-steps


def scsa_calibration_steps(arm: Arm) -> int:
    """Decode steps an arm's server spends calibrating SCSA before its taus freeze: 0 for an arm
    that is not SCSA or loads its taus (`--scsa-taus`)."""
    if flag_value(arm.flags, "--sparse-attn") != "scsa" or flag_value(arm.flags, "--scsa-taus") is not None:
        return 0
    steps = flag_value(arm.flags, "--scsa-calib-steps")
    return int(steps) if steps is not None else SCSA_CALIB_STEPS


def _uses_sparse_flags(flags: tuple[str, ...]) -> bool:
    if flag_value(flags, "--sparse-attn") in ("off", "0", "false", "none"):
        return False
    return any(tok.startswith(("--sparse", "--scsa")) for tok in flags)


# Flags whose value is a file: a relative path is taken from the gate file's folder, as a model
# path is, so that a gate and the taus it loads travel together.
FILE_FLAGS = {"--scsa-taus": "read", "--scsa-taus-out": "written"}


def _resolve_file_flags(flags: tuple[str, ...], base: Path, bad) -> tuple[str, ...]:
    out = list(flags)
    for i, tok in enumerate(flags):
        flag, eq, value = tok.partition("=")
        if flag not in FILE_FLAGS:
            continue
        if not eq:
            if i + 1 >= len(flags):
                bad(f"'{flag}' needs a file")
                continue
            value = flags[i + 1]
        resolved = Path(value) if Path(value).is_absolute() else base / value
        if FILE_FLAGS[flag] == "read" and not resolved.is_file():
            bad(f"{flag} {value}: no such file ({resolved})")
        if eq:
            out[i] = f"{flag}={resolved}"
        else:
            out[i + 1] = str(resolved)
    return tuple(out)


def _parse_arm(ck: _Checker, raw: Any, index: int, line: int, base: Path) -> Any:
    if isinstance(raw, str):
        raw_map = _Map(name=raw)
        raw_map.line, raw_map.lines = line, {"name": line}
        raw = raw_map
    if not isinstance(raw, _Map):
        return ck.fail(line, f"arms[{index}]: must be a mapping (name, flags, ...) or a name, "
                             f"not {_type_name(raw)}")
    line = raw.line
    label = f"arms[{index}]" + (f" ('{raw['name']}')" if isinstance(raw.get("name"), str) else "")
    ck.unknown_keys(raw, ARM_KEYS, f"{label}: ")
    before = len(ck.problems)

    def bad(key: str, msg: str) -> None:
        ck.fail(raw.lines.get(key, line), f"{label}: {key}: {msg}")

    name = raw.get("name")
    if "name" not in raw:
        bad("name", "missing; every arm needs a name")
    elif not isinstance(name, str) or not NAME_RE.match(name):
        bad("name", f"{name!r} is not a valid arm name (lower case letters, digits, '.', '_', '-')")

    flags: tuple[str, ...] = ()
    if "flags" in raw:
        value = raw["flags"]
        if isinstance(value, str):
            try:
                flags = tuple(shlex.split(value))
            except ValueError as e:
                bad("flags", f"cannot split {value!r} into arguments ({e})")
        elif isinstance(value, list):
            tokens = []
            for i, tok in enumerate(value):
                if isinstance(tok, bool):
                    bad("flags", f"item {i} is the boolean {tok} (YAML reads on/off/yes/no as booleans); "
                                 f"quote it: \"{'on' if tok else 'off'}\"")
                elif isinstance(tok, (str, int, float)):
                    tokens.append(str(tok))
                else:
                    bad("flags", f"item {i} must be a string, not {_type_name(tok)}")
            flags = tuple(tokens)
        elif value is not None:
            bad("flags", f"must be a list of strings (or one string), not {_type_name(value)}")
        for tok in flags:
            flag = tok.split("=", 1)[0]
            if flag in RESERVED_FLAGS:
                owner = RESERVED_FLAGS[flag]
                by = "by the harness" if owner == "the harness" else f"from the gate's '{owner}'"
                bad("flags", f"'{flag}' is set {by}; an arm must not set it")

        flags = _resolve_file_flags(flags, base, lambda msg: bad("flags", msg))

    variant = raw.get("variant", "patched")
    if variant not in VARIANTS:
        bad("variant", f"{variant!r} is not a build variant; known: {', '.join(VARIANTS)}")

    sparse = _uses_sparse_flags(flags)
    if "sparse" in raw:
        if not isinstance(raw["sparse"], bool):
            bad("sparse", f"must be true or false, not {_type_name(raw['sparse'])} ({raw['sparse']!r})")
        else:
            sparse = raw["sparse"]
    if variant == "upstream":
        if sparse:
            bad("sparse", "the upstream build has no sparse attention; use variant: patched")
        if any(tok.startswith("--sparse") for tok in flags):
            bad("flags", "the upstream build has no --sparse-* flags; use variant: patched")

    coverage = None
    from_flags = flag_value(flags, "--sparse-attn-coverage")
    if from_flags is not None:
        coverage = _as_float(from_flags)
    if "coverage" in raw and raw["coverage"] is not None:
        given = _as_float(raw["coverage"])
        if given is None:
            bad("coverage", f"must be a number, not {_type_name(raw['coverage'])} ({raw['coverage']!r})")
        elif not (0 < given <= 1) or math.isnan(given):
            bad("coverage", f"{given} is out of range (0 < coverage <= 1)")
        elif coverage is not None and not math.isclose(coverage, given):
            bad("coverage", f"{given} disagrees with --sparse-attn-coverage {from_flags} in flags")
        coverage = given
    elif coverage is not None and not (0 < coverage <= 1):
        bad("flags", f"--sparse-attn-coverage {from_flags} is out of range (0 < coverage <= 1)")

    env: list[tuple[str, str]] = []
    if "env" in raw and raw["env"] is not None:
        value = raw["env"]
        if not isinstance(value, dict):
            bad("env", f"must be a mapping of variable to value, not {_type_name(value)}")
        else:
            for key, val in value.items():
                if not isinstance(key, str) or not ENV_NAME_RE.match(key):
                    bad("env", f"{key!r} is not a GGML_* or LLAMA_* variable name")
                elif isinstance(val, bool) or not isinstance(val, (str, int, float)):
                    bad("env", f"{key}: the value must be a string or a number, not {_type_name(val)}")
                else:
                    env.append((key, str(val)))

    if len(ck.problems) > before:
        return _INVALID
    return Arm(name=name, flags=flags, variant=variant, sparse=sparse, coverage=coverage, env=tuple(env))


# --- the gate ----------------------------------------------------------------------------------

TOP_KEYS = ("name", "kind", "description", "models", "context_lengths", "cache_types", "arms",
            "samples", "tasks", "repeats", "n_predict", "batch", "clients", "requests", "time_limit",
            "skip_steps", "calibration_samples", "shared_prefill", "only_samples", "stagger", "speed_context", "seed",
            "threads", "thresholds")
REQUIRED = ("kind", "models", "context_lengths", "arms")
KIND_ONLY = {"tasks": ("niah", "load", "frontier"), "repeats": ("ab", "frontier"), "batch": ("ab", "niah", "load"),
             "clients": ("load",), "requests": ("load",), "time_limit": ("load",), "skip_steps": ("logits",),
             "calibration_samples": ("niah", "frontier"), "shared_prefill": ("niah", "frontier"),
             "only_samples": ("niah", "frontier"), "stagger": ("niah",), "speed_context": ("frontier",)}
MIN_ARMS = {"identity": 2, "logits": 2, "niah": 1, "ab": 1, "load": 1, "frontier": 2}


def load(path: Path) -> GateSpec:
    """Read and check one gate file; SpecError lists every problem, each with file and line."""
    path = Path(path)
    shown = _shown(path)
    data = _read_yaml(path, shown)
    if data is None:
        raise SpecError(f"{shown}: empty gate file; it needs at least: {', '.join(REQUIRED)}")
    if not isinstance(data, _Map):
        raise SpecError(f"{shown}: a gate file must be a mapping of keys (kind, models, ...), "
                        f"not {_type_name(data)}")
    ck = _Checker(shown)
    ck.unknown_keys(data, TOP_KEYS)
    for key in REQUIRED:
        if key not in data:
            ck.fail(None, f"key '{key}' missing; required keys: {', '.join(REQUIRED)}")
    lines = data.lines
    values: dict[str, Any] = {}

    # name and kind first: the rest depends on the kind
    if "name" in data:
        name = data["name"]
        if not isinstance(name, str) or not NAME_RE.match(name):
            ck.fail(lines["name"], f"name: {name!r} is not a valid gate name "
                                   "(lower case letters, digits, '.', '_', '-')")
        values["name"] = name
    else:
        values["name"] = path.stem
        if not NAME_RE.match(path.stem):
            ck.fail(None, f"name: the file stem {path.stem!r} is not a valid gate name "
                          "(lower case letters, digits, '.', '_', '-'); rename the file or set name:")

    kind = data.get("kind", _INVALID)
    if "kind" in data and kind not in KINDS:
        close = difflib.get_close_matches(str(kind), KINDS, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        kind = ck.fail(lines["kind"], f"kind: {data['kind']!r} is not a gate kind{hint}; "
                                      f"known: {', '.join(KINDS)}")
    values["kind"] = kind

    if "description" in data:
        d = data["description"]
        if not isinstance(d, str):
            ck.fail(lines["description"], f"description: must be a string, not {_type_name(d)}")
        values["description"] = d.strip() if isinstance(d, str) else ""

    for key, kinds in KIND_ONLY.items():
        if key in data and kind is not _INVALID and kind not in kinds:
            ck.fail(lines[key], f"{key}: applies to kind {' or '.join(kinds)} only (this gate is kind {kind})")

    if "models" in data:
        values["models"] = _unique_list(ck, data, "models", _model(path.resolve().parent), "model names")
    if "context_lengths" in data:
        values["context_lengths"] = _unique_list(ck, data, "context_lengths", _context_item,
                                                 "positive token counts")
    if "cache_types" in data:
        values["cache_types"] = _unique_list(ck, data, "cache_types", _choice(CACHE_TYPES, "KV cache type"),
                                             "KV cache types")
    if "tasks" in data:
        values["tasks"] = _unique_list(ck, data, "tasks", _choice(NIAH_TASKS, "niah task"), "niah tasks")
    if "batch" in data:
        values["batch"] = _unique_list(ck, data, "batch", _positive_item, "positive integers")

    for key in ("samples", "n_predict", "clients", "requests"):
        if key in data:
            values[key] = _positive_int(ck, data, key)
    if "time_limit" in data:
        t = _as_float(data["time_limit"])
        if t is None or not math.isfinite(t) or t <= 0:
            ck.fail(lines["time_limit"], f"time_limit: must be a positive number of seconds, not {data['time_limit']!r}")
        else:
            values["time_limit"] = t
    if kind == "load" and "batch" in data and isinstance(values.get("batch"), tuple) and len(values["batch"]) != 1:
        ck.fail(lines["batch"], "batch: kind load takes one value, the server's --parallel slots")
    if "repeats" in data:
        if kind in ("ab", "frontier"):
            values["repeats"] = _positive_int(
                ck, data, "repeats", MIN_AB_REPEATS,
                reason=f" for kind {kind}: two identical dense arms differ by up to 10% in decode speed "
                       f"with 2 repeats, so fewer than {MIN_AB_REPEATS} cannot tell a real change from noise")
        else:
            values["repeats"] = _positive_int(ck, data, "repeats")
    if "seed" in data:
        values["seed"] = _positive_int(ck, data, "seed", 0)
    if "skip_steps" in data:
        values["skip_steps"] = _positive_int(ck, data, "skip_steps", 0)
        if isinstance(values["skip_steps"], int) and isinstance(values.get("samples"), int) \
                and values["skip_steps"] >= values["samples"] + 1:
            ck.fail(lines["skip_steps"], f"skip_steps: {values['skip_steps']} leaves none of the "
                                         f"{values['samples'] + 1} rows (samples + the prefill's) to compare")
    if "calibration_samples" in data:
        values["calibration_samples"] = _positive_int(ck, data, "calibration_samples", 0)
    if "shared_prefill" in data:
        if not isinstance(data["shared_prefill"], bool):
            ck.fail(data.lines["shared_prefill"], f"shared_prefill: must be true or false, not "
                                                  f"{_type_name(data['shared_prefill'])} ({data['shared_prefill']!r})")
        elif data["shared_prefill"] and "batch" in data and data["batch"] not in (1, [1]):
            ck.fail(data.lines["shared_prefill"], "shared_prefill: the arms answer one prompt at a time; "
                                                  "it takes no batch but [1]")
        else:
            values["shared_prefill"] = data["shared_prefill"]
    if "stagger" in data:
        t = _as_float(data["stagger"])
        if t is None or not math.isfinite(t) or t < 0 or t > 600:
            ck.fail(lines["stagger"], f"stagger: must be seconds between arrivals in [0, 600], not {data['stagger']!r}")
        elif t > 0 and (not isinstance(values.get("batch"), tuple) or max(values["batch"]) < 2):
            ck.fail(lines["stagger"], "stagger: needs a batch above 1 (requests under load); "
                                      "with batch [1] every request is alone")
        elif t > 0 and data.get("shared_prefill"):
            ck.fail(lines["stagger"], "stagger: the shared-prefill arms answer one prompt at a time")
        else:
            values["stagger"] = t
    if "only_samples" in data:
        values["only_samples"] = _unique_list(ck, data, "only_samples", _index_item, "sample indices")
        n = values.get("samples", GateSpec.samples)
        if isinstance(values["only_samples"], tuple) and isinstance(n, int):
            outside = [i for i in values["only_samples"] if i >= n]
            if outside:
                values["only_samples"] = ck.fail(
                    lines["only_samples"], f"only_samples: {outside} outside the {n} samples "
                                           f"(indices 0 to {n - 1})")
    if "threads" in data:
        values["threads"] = None if data["threads"] is None else _positive_int(ck, data, "threads")
    if "n_predict" not in data and kind in ("niah", "frontier"):
        values["n_predict"] = 128
    if "speed_context" in data:
        n = _context_length(data["speed_context"])
        if n is None:
            ck.fail(lines["speed_context"], f"speed_context: must be a positive token count (8192 or \"8K\"), "
                                            f"not {data['speed_context']!r}")
        else:
            values["speed_context"] = n

    if "arms" in data:
        raw_arms = data["arms"]
        if not isinstance(raw_arms, list):
            values["arms"] = ck.fail(lines["arms"], f"arms: must be a list of arms, not {_type_name(raw_arms)}")
        elif not raw_arms:
            values["arms"] = ck.fail(lines["arms"], "arms: must not be empty; a gate needs at least one arm")
        else:
            arms = [_parse_arm(ck, a, i, lines["arms"], path.resolve().parent) for i, a in enumerate(raw_arms)]
            seen: dict[str, int] = {}
            for i, a in enumerate(raw_arms):
                arm_name = a if isinstance(a, str) else a.get("name") if isinstance(a, _Map) else None
                if not isinstance(arm_name, str):
                    continue
                if arm_name in seen:
                    ck.fail(a.line if isinstance(a, _Map) else lines["arms"],
                            f"arms[{i}]: name '{arm_name}' is used twice (also arms[{seen[arm_name]}]); "
                            "arm names must be unique")
                seen.setdefault(arm_name, i)
            if kind in MIN_ARMS and len(arms) < MIN_ARMS[kind]:
                ck.fail(lines["arms"], f"arms: kind {kind} needs at least {MIN_ARMS[kind]} arms "
                                       "(the first is the reference the others are compared with)")
            elif kind == "frontier" and arms and arms[0] is not _INVALID and arms[0].sparse:
                ck.fail(lines["arms"], f"arms: kind frontier measures every setting against dense: its first arm "
                                       f"must be dense (no sparse flags), not '{arms[0].name}'")
            values["arms"] = tuple(arms) if all(a is not _INVALID for a in arms) else _INVALID

    if "thresholds" in data:
        raw_t = data["thresholds"]
        line = lines["thresholds"]
        thresholds: dict[str, float] = {}
        if raw_t is None:
            pass
        elif not isinstance(raw_t, _Map):
            ck.fail(line, f"thresholds: must be a mapping of name: number, not {_type_name(raw_t)}")
        elif kind is not _INVALID:
            known = THRESHOLDS[kind]
            names = tuple(known)
            for key, value in raw_t.items():
                kline = raw_t.lines.get(key, line)
                if key not in known:
                    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.6)
                    hint = f" (did you mean '{close[0]}'?)" if close else ""
                    ck.fail(kline, f"thresholds: '{key}' unknown for kind {kind}{hint}; known: {', '.join(names)}")
                    continue
                t = known[key]
                v = _as_float(value)
                if v is None or math.isnan(v):
                    ck.fail(kline, f"thresholds: {key}: must be a number, not {_type_name(value)} ({value!r})")
                    continue
                too_low = v <= t.low if t.low_open else v < t.low
                if too_low or (t.high is not None and v > t.high):
                    rng = f"{'>' if t.low_open else '>='} {t.low:g}" + (f" and <= {t.high:g}" if t.high is not None else "")
                    ck.fail(kline, f"thresholds: {key}: {v:g} is out of range (must be {rng}; {t.help})")
                    continue
                if t.integer and not v.is_integer():
                    ck.fail(kline, f"thresholds: {key}: must be a whole number ({t.help}), not {v:g}")
                    continue
                thresholds[key] = int(v) if t.integer else v
        values["thresholds"] = thresholds

    if ck.problems:
        raise SpecError(ck.message())
    return GateSpec(path=path.resolve(), **values)


def discover(directory: Path) -> list[GateSpec]:
    """Every gate file (*.yaml, *.yml) in `directory`, sorted by file name; all problems at once."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SpecError(f"{_shown(directory)}: no such gate directory")
    files = sorted(p for p in directory.iterdir()
                   if p.suffix in (".yaml", ".yml") and p.is_file() and not p.name.startswith("."))
    specs: list[GateSpec] = []
    problems: list[str] = []
    for f in files:
        try:
            specs.append(load(f))
        except SpecError as e:
            problems.append(str(e))
    names: dict[str, GateSpec] = {}
    for s in specs:
        if s.name in names:
            problems.append(f"{_shown(s.path)}: name: gate '{s.name}' is also defined in "
                            f"{_shown(names[s.name].path)}; gate names must be unique")
        names.setdefault(s.name, s)
    if problems:
        raise SpecError("\n".join(problems))
    return specs
