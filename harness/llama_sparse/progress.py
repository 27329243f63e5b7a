"""Progress for long work (a 32K prefill on 2 cores takes minutes): a rich bar on a terminal,
plain timestamped lines otherwise (stdout not a terminal, or the CI variable set), so CI logs
stay readable. No global state: every `Progress` owns its own console.

    with Progress() as progress:
        task = progress.task("prefill 32K", total=4)
        for chunk in chunks:
            ...
            task.advance()
        progress.log("prefill done")
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any


def _want_plain(stream: IO[str]) -> bool:
    if os.environ.get("CI"):
        return True
    if os.environ.get("TERM") == "dumb":
        return True
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


class TaskHandle:
    """One line of progress: `advance(n)` and `update(description=..., total=...)`."""

    def __init__(self, owner: "Progress", description: str, total: float | None) -> None:
        self._owner = owner
        self.description = description
        self.total = total
        self.completed: float = 0
        self.started = time.monotonic()
        self._rich_id: Any = None

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def advance(self, n: float = 1) -> None:
        self.completed += n
        self._owner._advanced(self, n)

    def update(self, description: str | None = None, total: float | None = None,
               completed: float | None = None) -> None:
        if description is not None:
            self.description = description
        if total is not None:
            self.total = total
        if completed is not None:
            self.completed = completed
        self._owner._updated(self)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class Progress:
    """Context manager over rich.progress, or plain line prints when that would not render."""

    def __init__(self, stream: IO[str] | None = None, plain: bool | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self.plain = _want_plain(self._stream) if plain is None else plain
        self._rich: Any = None
        self._entered = False

    def __enter__(self) -> "Progress":
        if not self.plain:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       SpinnerColumn, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            console = Console(file=self._stream)
            self._rich = RichProgress(
                SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                console=console, transient=False,
            )
            self._rich.__enter__()
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._entered = False
        if self._rich is not None:
            rich, self._rich = self._rich, None
            rich.__exit__(*exc)

    def _check(self) -> None:
        if not self._entered:
            raise RuntimeError("use Progress as a context manager: `with Progress() as p: ...`")

    def _line(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def _plain_status(self, task: TaskHandle) -> str:
        count = _num(task.completed) + (f"/{_num(task.total)}" if task.total is not None else "")
        left = ""
        if task.total is not None and 0 < task.completed < task.total:
            # the rate so far: what rich's bar shows as time remaining on a terminal
            left = f", about {_duration(task.elapsed / task.completed * (task.total - task.completed))} left"
        return f"[{task.elapsed:7.1f}s] {task.description}: {count}{left}"

    def task(self, description: str, total: float | None = None) -> TaskHandle:
        """A new line of progress; total None when the amount of work is not known."""
        self._check()
        handle = TaskHandle(self, description, total)
        if self._rich is not None:
            handle._rich_id = self._rich.add_task(description, total=total)
        else:
            self._line(self._plain_status(handle))
        return handle

    def log(self, msg: str) -> None:
        """A message above the bar (or a plain line)."""
        if self._rich is not None:
            self._rich.console.print(msg, markup=False, highlight=False)
        else:
            self._line(str(msg))

    def _advanced(self, task: TaskHandle, n: float) -> None:
        self._check()
        if self._rich is not None:
            self._rich.advance(task._rich_id, n)
        else:
            self._line(self._plain_status(task))

    def _updated(self, task: TaskHandle) -> None:
        self._check()
        if self._rich is not None:
            self._rich.update(task._rich_id, description=task.description, total=task.total,
                              completed=task.completed)
        # plain mode: the next advance shows the new description; no extra line
