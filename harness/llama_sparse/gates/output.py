"""What a gate run leaves on disk: results/<gate>-<YYYYmmdd-HHMMSS>/{report.json,report.md,plot.png}.

`write` is meant to be called after every arm, so that a server that dies later in the run
leaves everything measured so far behind; every file is replaced atomically.
"""

from __future__ import annotations

import time
from pathlib import Path

from llama_sparse.errors import UserError
from llama_sparse.files import write_atomically
from llama_sparse.gates.markdown import markdown_table
from llama_sparse.gates.plot import plot
from llama_sparse.gates.report import GateReport, from_json, to_json

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
PLOT_PNG = "plot.png"


def run_dir(out_root: Path, gate: str, when: float | None = None) -> Path:
    """A fresh results/<gate>-<YYYYmmdd-HHMMSS>/ under `out_root` (suffixed -2, -3 ... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    path = out_root / f"{gate}-{stamp}"
    n = 2
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path = out_root / f"{gate}-{stamp}-{n}"
            n += 1


def load(out_dir: Path) -> GateReport:
    """The report of an earlier run from its report.json (to draw it again with this harness)."""
    path = Path(out_dir) / REPORT_JSON
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: no report.json there (is it a gate's results folder?)") from None
    return from_json(text, path)


def write(report: GateReport, out_dir: Path) -> dict[str, Path]:
    """Write report.json, report.md and (if there is anything to plot) plot.png; safe to repeat."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / REPORT_JSON, "md": out_dir / REPORT_MD}
    write_atomically(paths["json"], to_json(report).encode())
    write_atomically(paths["md"], markdown_table(report).encode())
    png = plot(report, out_dir / PLOT_PNG)
    if png is not None:
        paths["png"] = png
    return paths
