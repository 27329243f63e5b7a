"""What a gate is, as data: its arms, its settings, the thresholds a kind judges by, the kind.

Nothing here reads a file or runs anything: `spec` loads gate files into these, each kind module
declares its `Kind`, the runner runs one and judges its results by the kind's thresholds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Threshold:
    """A pass threshold of a gate kind: the metric it bounds, from which side, the range its value
    may take in a gate file, and the value that holds when the file sets none."""

    help: str
    metric: str                      # the result metric it bounds
    bound: str                       # "min": metric >= value passes; "max": metric <= value passes
    low: float
    high: float | None = None
    integer: bool = False
    low_open: bool = False           # value must be > low rather than >= low
    default: float | None = None     # in force when the gate file does not set it (None: off)
    settable: bool = True            # False: a rule of the kind that a gate file cannot loosen
    sparse_only: bool = False        # judges the sparse arms only (dense is the yardstick)

    def __post_init__(self) -> None:
        if self.bound not in ("min", "max"):
            raise ValueError(f"threshold bound {self.bound!r}: must be 'min' or 'max'")

    def passes(self, value: float, limit: float) -> bool:
        return value >= limit if self.bound == "min" else value <= limit


@dataclass(frozen=True)
class Kind:
    """A gate kind: what it runs, the keys of its own a gate file may give it, its thresholds, and
    how its report differs from the common one."""

    name: str
    run: Callable[[Any], None]                      # run(ctx: GateContext): records results
    keys: tuple[str, ...] = ()                      # keys beyond the common ones it reads
    thresholds: Mapping[str, Threshold] = field(default_factory=dict)
    min_arms: int = 1                               # the first arm is the one the others are compared with
    min_repeats: int = 1
    n_predict: int = 64                             # tokens per request when the file gives none
    first_arm_dense: bool = False                   # the first arm must carry no sparse flags
    markdown: Callable[[Any], list[str]] | None = None         # more report.md sections (GateReport)
    plot: Callable[[Any, Path], Path | None] | None = None     # its own plot.png (GateReport, path)


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
    kind: str                                   # a Kind's name (gates.kinds.KINDS)
    description: str = ""
    models: tuple[str, ...]                     # model names or absolute paths to .gguf files
    context_lengths: tuple[int, ...]            # in tokens
    cache_types: tuple[str, ...] = ("f16",)     # KV cache types (k and v)
    arms: tuple[Arm, ...]
    samples: int = 24                           # niah samples / identity prompts / logits steps
    tasks: tuple[str, ...] = ("niah_single_1",)  # niah only
    repeats: int = 5                            # ab, frontier: >= 5
    speed_context: int = 8192                   # frontier only: the context its speed is measured at
    prompt_text: str = "reference"              # ab only: what the prompt decode continues: "reference" (the
                                                # pinned tree's docs, much of them code) or "prose" (the needle
                                                # gates' prose, with a request to summarise it)
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
    shared_prefill: bool = False                # niah, ab: each prompt prefilled once, by the first
                                                # arm; every other arm restores that slot and decodes
    stagger: float = 0.0                        # niah only, batch > 1: seconds between request arrivals
                                                # (each on its own client), answer lengths varied
    only_samples: tuple[int, ...] = ()          # niah only: answer just these sample indices (of
                                                # `samples`, each the same prompt as in the full run)
    json_schema: dict[str, Any] | None = None   # niah only: every scored answer constrained to it
                                                # (llama-server's json_schema: a grammar); with a
                                                # mix, the "json" requests only
    mix: tuple[str, ...] = ()                   # niah only: the request each sample sends, by its
                                                # index in turn (needles.REQUEST_KINDS)
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
            "only_samples": list(self.only_samples), "json_schema": self.json_schema, "mix": list(self.mix), "stagger": self.stagger, "speed_context": self.speed_context, "prompt_text": self.prompt_text, "seed": self.seed, "threads": self.threads,
            "thresholds": dict(self.thresholds),
        }

