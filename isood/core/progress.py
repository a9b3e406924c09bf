"""Progress on stderr, the same API whether shown or not.

On a terminal a rich progress bar; when stderr is not a terminal (a log file, a pipe, a batch job) rich would draw
nothing until the end (and a transient bar leaves a blank line), so progress is written as plain lines instead:
one when a task starts, at most one every ``interval`` seconds while it runs, and one when it ends.
"""

from __future__ import annotations

import re
import time
from typing import Any, Iterable, Iterator

__all__ = ["progress_bar", "track", "LineProgress", "LINE_INTERVAL", "is_progress_line"]

_LINE = re.compile(r"^.+: \d+(\.\d+)?(/\d+(\.\d+)? \(\d+%\))?, \d+:\d\d elapsed(, \d+\.\d\d \S+/s)?$")


def is_progress_line(text: str) -> bool:
    """Whether a line of stderr is a progress line of ``LineProgress`` (not a message or an error)."""
    return bool(_LINE.match(text.strip()))

#: Seconds between two progress lines of one task when stderr is not a terminal.
LINE_INTERVAL = 10.0


def progress_bar(enabled: bool = True, *, rate_unit: str | None = None, transient: bool = False, console=None,
                 interval: float = LINE_INTERVAL):
    """A rich progress bar on stderr (description, bar, done/total, elapsed, remaining; with ``rate_unit`` a
    ``{task.fields[rate]} <unit>/s`` column, set with ``bar.update(task, rate=...)``); plain progress lines
    (``LineProgress``) when stderr is not a terminal. Disabled: a silent bar with the same API."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    console = console or Console(stderr=True)
    if enabled and not console.is_terminal:
        return LineProgress(console, rate_unit=rate_unit, interval=interval)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if rate_unit:
        columns.append(TextColumn("{task.fields[rate]:.2f} " + rate_unit + "/s"))
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*columns, console=console, disable=not enabled, transient=transient)


class LineProgress:
    """The part of rich's ``Progress`` API isood uses (``add_task``, ``advance``, ``update``, a context manager),
    written as plain lines ``description: done/total (pct%), elapsed[, rate unit/s]`` for logs and pipes."""

    def __init__(self, console, *, rate_unit: str | None = None, interval: float = LINE_INTERVAL,
                 clock=time.monotonic) -> None:
        self.console, self.rate_unit, self.interval, self.clock = console, rate_unit, interval, clock
        self.tasks: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        for task_id, task in self.tasks.items():
            if not task["ended"]:
                self._line(task_id)

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **fields) -> int:
        task_id = len(self.tasks)
        now = self.clock()
        self.tasks[task_id] = {"description": description, "total": total, "completed": completed, "start": now,
                               "last": now, "fields": dict(fields), "ended": False}
        self._line(task_id, started=True)
        return task_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, total: float | None = None, completed: float | None = None,
               advance: float | None = None, description: str | None = None, **fields) -> None:
        task = self.tasks[task_id]
        if total is not None:
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        if advance:
            task["completed"] += advance
        if description is not None:
            task["description"] = description
        task["fields"].update({k: v for k, v in fields.items() if k not in ("refresh", "visible")})
        finished = task["total"] is not None and task["completed"] >= task["total"]
        if finished and not task["ended"]:
            self._line(task_id)
        elif not finished and self.clock() - task["last"] >= self.interval:
            self._line(task_id)

    def _line(self, task_id: int, started: bool = False) -> None:
        task = self.tasks[task_id]
        now = self.clock()
        task["last"] = now
        done, total = task["completed"], task["total"]
        count = f"{done:g}/{total:g}" if total is not None else f"{done:g}"
        if total:
            count += f" ({100.0 * done / total:.0f}%)"
        elapsed = int(now - task["start"])
        text = f"{task['description']}: {count}, {elapsed // 60}:{elapsed % 60:02d} elapsed"
        rate = task["fields"].get("rate")
        if self.rate_unit and rate is not None and not started:
            text += f", {float(rate):.2f} {self.rate_unit}/s"
        if total is not None and done >= total:
            task["ended"] = True
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)


def track(iterable: Iterable, total: int | None, description: str, enabled: bool = True) -> Iterator:
    """Iterate ``iterable`` with a transient progress bar (progress lines when stderr is not a terminal; nothing
    when disabled)."""
    if not enabled:
        yield from iterable
        return
    with progress_bar(True, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)
