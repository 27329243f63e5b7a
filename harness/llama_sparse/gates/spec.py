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
import json
import math
import re
import shlex
from pathlib import Path
from typing import Any

from llama_sparse.gates import niah
from llama_sparse.gates.flags import RESERVED_FLAGS, flag_value, resolve_file_flags, uses_sparse_flags
from llama_sparse.gates.kinds import KINDS
from llama_sparse.gates.needles import REQUEST_KINDS
from llama_sparse.gates.schema import Arm, GateSpec, Threshold
from llama_sparse.gates.yamlfile import Map as _Map
from llama_sparse.gates.yamlfile import SpecError, read_yaml as _read_yaml, shown_path as _shown
from llama_sparse.models import MODEL_NAMES as KNOWN_MODELS

__all__ = ["Arm", "GateSpec", "SpecError", "discover", "load"]
VARIANTS = ("patched", "upstream")
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
NIAH_TASKS = niah.TASKS
NAME_RE = re.compile(r"^[a-z0-9._-]+$")


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

        flags = resolve_file_flags(flags, base, lambda msg: bad("flags", msg))

    variant = raw.get("variant", "patched")
    if variant not in VARIANTS:
        bad("variant", f"{variant!r} is not a build variant; known: {', '.join(VARIANTS)}")

    sparse = uses_sparse_flags(flags)
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

PROMPT_TEXTS = ("reference", "prose")   # ab: what the decoded prompt is (gates.ab.prompt_tokens)

COMMON_KEYS = ("name", "kind", "description", "models", "context_lengths", "cache_types", "arms",
               "samples", "n_predict", "seed", "threads", "thresholds")
# the keys only some kinds read, and which: from each kind's own declaration
KIND_ONLY = {key: tuple(k for k, kind in KINDS.items() if key in kind.keys)
             for key in dict.fromkeys(key for kind in KINDS.values() for key in kind.keys)}
TOP_KEYS = COMMON_KEYS + tuple(KIND_ONLY)
REQUIRED = ("kind", "models", "context_lengths", "arms")


def settable_thresholds(kind: str) -> dict[str, Threshold]:
    """The thresholds a gate file of `kind` may set (the kind's fixed rules are not among them)."""
    return {name: t for name, t in KINDS[kind].thresholds.items() if t.settable}


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
    if "kind" in data and (not isinstance(kind, str) or kind not in KINDS):
        close = difflib.get_close_matches(str(kind), list(KINDS), n=1, cutoff=0.6)
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
        least = KINDS[kind].min_repeats if kind in KINDS else 1
        if least > 1:
            values["repeats"] = _positive_int(
                ck, data, "repeats", least,
                reason=f" for kind {kind}: two identical dense arms differ by up to 10% in decode speed "
                       f"with 2 repeats, so fewer than {least} cannot tell a real change from noise")
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
    if "json_schema" in data:
        schema = data["json_schema"]
        if not isinstance(schema, dict) or not schema:
            ck.fail(lines["json_schema"], f"json_schema: must be a JSON schema (a mapping), not {_type_name(schema)} ({schema!r})")
        else:
            values["json_schema"] = json.loads(json.dumps(schema))  # plain JSON, as the request sends it
    if "mix" in data:
        mix = data["mix"]
        if not isinstance(mix, list) or not mix or any(m not in REQUEST_KINDS for m in mix):
            ck.fail(lines["mix"], f"mix: must be a list of the requests {', '.join(REQUEST_KINDS)} "
                                  f"(one per sample in turn), not {mix!r}")
        elif "json" in mix and "json_schema" not in data:
            ck.fail(lines["mix"], "mix: its json requests need the gate's json_schema")
        elif data.get("shared_prefill"):
            ck.fail(lines["mix"], "mix: the shared-prefill arms answer one greedy prompt at a time")
        else:
            values["mix"] = tuple(mix)
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
    if "n_predict" not in data and kind in KINDS:
        values["n_predict"] = KINDS[kind].n_predict
    if "prompt_text" in data:
        if data["prompt_text"] not in PROMPT_TEXTS:
            ck.fail(lines["prompt_text"], f"prompt_text: must be one of {', '.join(PROMPT_TEXTS)}, not {data['prompt_text']!r}")
        else:
            values["prompt_text"] = data["prompt_text"]
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
            least = KINDS[kind].min_arms if kind in KINDS else 1
            if len(arms) < least:
                ck.fail(lines["arms"], f"arms: kind {kind} needs at least {least} arms "
                                       "(the first is the reference the others are compared with)")
            elif kind in KINDS and KINDS[kind].first_arm_dense and arms[0] is not _INVALID and arms[0].sparse:
                ck.fail(lines["arms"], f"arms: kind {kind} measures every setting against dense: its first arm "
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
            known = settable_thresholds(kind)
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
