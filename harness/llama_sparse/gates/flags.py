"""What the harness knows about llama-server's flags: the ones it sets itself, the value a flag
was given, which flags make an arm sparse or SCSA, and flags whose value is a file."""

from __future__ import annotations

from pathlib import Path

from llama_sparse.gates.schema import Arm

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


def uses_sparse_flags(flags: tuple[str, ...]) -> bool:
    """Whether the flags switch a sparse method on (block-sparse or SCSA)."""
    off = ("off", "0", "false", "none")
    if flag_value(flags, "--sparse-attn") in off and flag_value(flags, "--sparse-prefill") in (None, *off):
        return False
    return any(tok.startswith(("--sparse", "--scsa")) for tok in flags)


# Flags whose value is a file: a relative path is taken from the gate file's folder, as a model
# path is, so that a gate and the taus it loads travel together.
FILE_FLAGS = {"--scsa-taus": "read", "--scsa-taus-out": "written"}


def resolve_file_flags(flags: tuple[str, ...], base: Path, bad) -> tuple[str, ...]:
    """`flags` with each file value taken from `base` when relative; `bad(message)` for a
    missing file or value."""
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

