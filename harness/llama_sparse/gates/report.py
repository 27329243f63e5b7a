"""A gate's report as data: each arm's result, the run's machine and builds, its JSON form, and
the needle-by-needle comparison the verdicts and tables share.

An arm that failed (server died, timed out) carries its error text and never a score: its
metrics are dropped when it is recorded, and it counts as failed. The files a run leaves on disk
are `output`'s; the markdown and the plot drawn from this data are `markdown`'s and `plot`'s.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from llama_sparse.errors import UserError
from llama_sparse.gates.schema import Arm, GateSpec, Kind

SCHEMA = 1


@dataclass
class ArmResult:
    arm: str
    model: str
    context: int
    cache_type: str
    batch: int = 1
    metrics: dict[str, float] = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)   # every raw sample
    calibration: list[dict] = field(default_factory=list)  # niah: unscored answers given first
    error: str | None = None     # server died / timed out: the error text with its log tail
    passed: bool | None = None

    def fail(self, error: str) -> "ArmResult":
        """Mark this result as errored: the error replaces any score, and it does not pass."""
        self.error = error
        self.metrics = {}
        self.passed = False
        return self

    def to_dict(self) -> dict[str, Any]:
        errored = self.error is not None
        return {
            "arm": self.arm, "model": self.model, "context": self.context,
            "cache_type": self.cache_type, "batch": self.batch,
            "metrics": {} if errored else dict(self.metrics),   # an error is never a score
            "samples": list(self.samples), "error": self.error,
            "passed": False if errored else self.passed,
            **({"calibration": list(self.calibration)} if self.calibration else {}),
        }


@dataclass
class GateReport:
    spec: GateSpec
    started: str
    finished: str | None = None
    machine: dict = field(default_factory=dict)   # from machine_info()
    builds: dict = field(default_factory=dict)    # {"patched": {"build_info": ..., "llama_sparse": ...}, ...}
    models: dict = field(default_factory=dict)    # name -> {"path": ..., "sha256": ...}
    results: list[ArmResult] = field(default_factory=list)
    passed: bool | None = None
    notes: list[str] = field(default_factory=list)
    cut_short: str | None = None  # why the run stopped before its end (an interrupt, a harness error)
    kind: Kind | None = None      # how its kind extends the common report (not written to report.json)

    def verdict(self) -> bool | None:
        """`passed`, except that an errored or failed result always makes the gate fail, and a run
        cut short has no verdict otherwise (what it did not measure cannot pass)."""
        if any(r.error is not None or r.passed is False for r in self.results):
            return False
        return None if self.cut_short else self.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "gate": self.spec.name, "kind": self.spec.kind,
            "spec": self.spec.to_dict(), "started": self.started, "finished": self.finished,
            "machine": self.machine, "builds": self.builds, "models": self.models,
            "results": [r.to_dict() for r in self.results], "passed": self.verdict(),
            "notes": list(self.notes), **({"cut_short": self.cut_short} if self.cut_short else {}),
        }


def now() -> str:
    """The local time, ISO 8601 with offset, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ---------------------------------------------------------------------------------------------
# the machine

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    """The SIMD features llama.cpp's CPU kernels depend on."""
    wanted = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
              "amx_tile", "asimd", "sve", "i8mm", "dotprod", "asimddp")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                have = set(value.split())
                return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine_info() -> dict:
    """Where the numbers were measured: host, CPU, cores, memory, Python, OS."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    mem = _memory_bytes()
    return {
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "memory_bytes": mem,
        "memory_gib": round(mem / 2**30, 1) if mem else None,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


# ---------------------------------------------------------------------------------------------
# JSON

def _jsonable(value: Any) -> Any:
    """Plain JSON: non-finite floats become null (strict JSON has no NaN), paths strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "item") and callable(value.item):   # numpy scalars
        try:
            return _jsonable(value.item())
        except (TypeError, ValueError):
            pass
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays
        return _jsonable(value.tolist())
    return str(value)


def _spec_from_dict(d: dict[str, Any]) -> GateSpec:
    known = {f.name for f in fields(GateSpec)}
    values: dict[str, Any] = {}
    for key, value in d.items():
        if key not in known:
            continue  # a key of a later harness: not needed to draw the results
        if key == "arms":
            value = tuple(Arm(**{**a, "flags": tuple(a.get("flags", ())),
                                 "env": tuple(sorted(a.get("env", {}).items()))}) for a in value)
        elif key == "path":
            value = Path(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[key] = value
    return GateSpec(**values)



def to_json(report: GateReport) -> str:
    """The report as strict JSON text (non-finite floats as null)."""
    return json.dumps(_jsonable(report.to_dict()), indent=2, allow_nan=False) + "\n"


def from_json(text: str, path: Path) -> GateReport:
    """A report from the JSON text `to_json` wrote (`path` names it in errors)."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not a readable report ({e})") from None
    if d.get("schema") != SCHEMA:
        raise UserError(f"{path}: report schema {d.get('schema')!r}, this harness reads {SCHEMA}")
    results = []
    for r in d["results"]:
        res = ArmResult(r["arm"], r["model"], r["context"], r["cache_type"], batch=r.get("batch", 1),
                        metrics=dict(r.get("metrics", {})), samples=list(r.get("samples", [])),
                        calibration=list(r.get("calibration", [])), error=r.get("error"), passed=r.get("passed"))
        results.append(res)
    report = GateReport(spec=_spec_from_dict(d["spec"]), started=d["started"], finished=d.get("finished"),
                        machine=d.get("machine", {}), builds=d.get("builds", {}), models=d.get("models", {}),
                        results=results, notes=list(d.get("notes", [])), cut_short=d.get("cut_short"))
    report.passed = d.get("passed")
    return report


# a needle the reference finds by a smaller decisive margin (nats) is marked thin: on SmolLM2 at
# 7K dense found one by 0.13 that dense with a q4_0 KV cache lost, and each build width moves it
THIN_MARGIN_NATS = 0.25


def needle_id(record: dict) -> str:
    return f"{record['task']}#{record['index']}"


def compare_needles(reference: list[dict], other: list[dict]) -> tuple[list[str], list[str]]:
    """Needle by needle: (the needles the reference found and `other` did not, the reverse)."""
    ref = {needle_id(x): x["score"] == 1.0 for x in reference}
    got = {needle_id(x): x["score"] == 1.0 for x in other}
    lost = [k for k, found in ref.items() if found and got.get(k) is False]
    gained = [k for k, found in got.items() if found and ref.get(k) is False]
    return lost, gained

