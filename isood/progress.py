"""L0: progress bars on stderr (rich), the same API whether shown or not."""

from __future__ import annotations

from typing import Iterable, Iterator

__all__ = ["progress_bar", "track"]


def progress_bar(enabled: bool = True, *, rate_unit: str | None = None, transient: bool = False, console=None):
    """A rich progress bar on stderr (description, bar, done/total, elapsed, remaining; with ``rate_unit`` a
    ``{task.fields[rate]} <unit>/s`` column, set with ``bar.update(task, rate=...)``). Disabled: a silent bar
    with the same API."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    if rate_unit:
        columns.append(TextColumn("{task.fields[rate]:.2f} " + rate_unit + "/s"))
    columns += [TimeElapsedColumn(), TimeRemainingColumn()]
    return Progress(*columns, console=console or Console(stderr=True), disable=not enabled, transient=transient)


def track(iterable: Iterable, total: int | None, description: str, enabled: bool = True) -> Iterator:
    """Iterate ``iterable`` with a transient progress bar (no bar when disabled)."""
    if not enabled:
        yield from iterable
        return
    with progress_bar(True, transient=True) as bar:
        task = bar.add_task(description, total=total)
        for item in iterable:
            yield item
            bar.advance(task)
