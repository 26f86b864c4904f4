"""One progress helper for every long step: a Rich bar with counts and the time left, or nothing.

``with steps("training probes", total) as bar: ... bar.advance()`` shows
``training probes ━━━━━━  3/10  0:00:04 0:00:09`` (done/total, elapsed, time left) while the step runs.
It is shown only when standard output is a terminal and layerscope logs at INFO (the CLI without
``--quiet``); in a pipe, a log file, a test or under ``--quiet`` nothing is printed. Either way the object
counts what was done (``done``, ``total``), so callers and tests read the same numbers the bar shows.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")


def wanted() -> bool:
    """Whether a progress bar should be drawn: standard output is a terminal and layerscope logs at INFO."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        tty = False
    return tty and logging.getLogger("layerscope").isEnabledFor(logging.INFO)


class Steps:
    """A count of done steps out of ``total``, drawn as a Rich bar when ``shown``."""

    def __init__(self, label: str, total: int | None, *, show: bool | None = None, console: Any = None):
        self.label = label
        self.total = None if total is None else int(total)
        self.done = 0
        self.shown = wanted() if show is None else bool(show)
        self._progress = None
        if self.shown:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True)
            self._task = self._progress.add_task(label, total=self.total)
            self._progress.start()

    def advance(self, n: int = 1) -> None:
        self.done += int(n)
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> "Steps":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def steps(label: str, total: int | None, *, show: bool | None = None, console: Any = None) -> Steps:
    """A progress count for a step of ``total`` parts (``None``: unknown total, the bar then only counts)."""
    return Steps(label, total, show=show, console=console)


def track(items: Iterable[T], label: str, total: int | None = None, *, show: bool | None = None,
          console: Any = None) -> Iterator[T]:
    """Yield ``items``, advancing a progress count after each one."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with steps(label, total, show=show, console=console) as bar:
        for item in items:
            yield item
            bar.advance()


# ------------------------------------------------------------- the extraction bar
# rows done of the total with texts/s and tokens/s (extract and Ray); drawn when asked, the caller decides


class _NoBar:
    def advance(self, rows: int, tokens: int) -> None:
        pass

    def close(self) -> None:
        pass


class _RichBar:
    def __init__(self, total_rows: int, total_tokens: int):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.progress = Progress(
            TextColumn("[bold]extracting"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            transient=False,
        )
        self.task = self.progress.add_task("extract", total=total_rows, rate="")
        self.t0 = time.perf_counter()
        self.tokens = 0
        self.rows = 0
        self.progress.start()

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self.progress.update(self.task, advance=rows,
                             rate=f"{self.rows / dt:,.0f} texts/s  {self.tokens / dt:,.0f} tokens/s")

    def close(self) -> None:
        self.progress.stop()


def progress_bar(progress: bool | Callable, total_rows: int, total_tokens: int):
    """A rich bar when ``progress`` is true, the caller's own when it is a callable, else none."""
    if callable(progress):
        return progress(total_rows, total_tokens)
    return _RichBar(total_rows, total_tokens) if progress else _NoBar()
