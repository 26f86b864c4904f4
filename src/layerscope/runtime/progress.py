"""The extraction progress bar: rows done of the total, texts/s and tokens/s (rich, imported when shown)."""

from __future__ import annotations

import time
from typing import Callable


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
