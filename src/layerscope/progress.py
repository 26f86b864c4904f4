"""One progress helper for every long step: a Rich bar with counts and the time left, or nothing.

``with steps("training probes", total) as bar: ... bar.advance()`` shows
``training probes ━━━━━━  3/10  0:00:04 0:00:09`` (done/total, elapsed, time left) while the step runs.
The bar is drawn when standard output is a terminal and layerscope logs at INFO (the CLI without
``--quiet``). When it logs at INFO into a pipe or a log file (a batch job, ``nohup``, Slurm), a plain line
is logged instead every ``LINE_EVERY_S`` seconds (``training probes: 3/10, 0:00:04 elapsed, about
0:00:09 left``), so an hour-long step is never silent; a step shorter than that prints nothing. Under
``--quiet`` (and in tests, which log at WARNING) nothing is printed. Either way the object counts what
was done (``done``, ``total``), so callers and tests read the same numbers the bar shows.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")


LINE_EVERY_S = 30.0  # seconds between progress lines in a log file
log = logging.getLogger("layerscope")


def mode() -> str | None:
    """How progress is shown: ``"bar"`` on a terminal, ``"lines"`` in a pipe or log file, ``None`` when quiet."""
    if not log.isEnabledFor(logging.INFO):
        return None
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdout
        tty = False
    return "bar" if tty else "lines"


class still:
    """``with still(say, "tracing the head graph"):`` around one long call that reports nothing itself: a line
    ``still tracing the head graph (0:01:00 elapsed)`` every ``every`` seconds (``LINE_EVERY_S``) from a
    background thread until the call returns, so a step of minutes is never silent; nothing for a short one."""

    def __init__(self, say: Callable[[str], None], doing: str, *, every: float | None = None):
        import threading

        self.say, self.doing = say, doing
        self.every = LINE_EVERY_S if every is None else every
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="layerscope-still", daemon=True)

    def _beat(self) -> None:
        t0 = time.perf_counter()
        while not self._done.wait(self.every):
            self.say(f"still {self.doing} ({clock(time.perf_counter() - t0)} elapsed)")

    def __enter__(self) -> "still":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def clock(seconds: float) -> str:
    """``3723.4 -> '1:02:03'``."""
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Lines:
    """Progress as a log line at most every ``every`` seconds: ``label: done/total, elapsed, time left``."""

    def __init__(self, label: str, total: int | None, *, unit: str = "", every: float | None = None):
        self.label, self.total, self.unit = label, total, unit
        self.every = LINE_EVERY_S if every is None else every
        self.t0 = self.last = time.perf_counter()
        self.lines = 0

    def due(self) -> float | None:
        """Seconds since the start when a line is due now, else None."""
        now = time.perf_counter()
        if now - self.last < self.every:
            return None
        self.last = now
        return now - self.t0

    def line(self, done: int, elapsed: float, *, fraction: float | None = None, extra: str = "") -> str:
        """The progress line for ``done`` of the total after ``elapsed`` seconds (``fraction``: of the work)."""
        of = f"/{self.total:,}" if self.total is not None else ""
        text = f"{self.label}: {done:,}{of}{' ' + self.unit if self.unit else ''}"
        if fraction is None and self.total:
            fraction = done / self.total
        if fraction is not None:
            text += f" ({100 * fraction:.0f}%)"
        text += f"{', ' + extra if extra else ''}, {clock(elapsed)} elapsed"
        if fraction and 0 < fraction < 1:
            text += f", about {clock(elapsed * (1 - fraction) / fraction)} left"
        return text

    def emit(self, text: str) -> None:
        self.lines += 1
        log.info(text)


class Steps:
    """A count of done steps out of ``total``, drawn as a Rich bar when ``shown``."""

    def __init__(self, label: str, total: int | None, *, show: bool | None = None, console: Any = None):
        self.label = label
        self.total = None if total is None else int(total)
        self.done = 0
        how = mode() if show is None else ("bar" if show else None)
        self.shown = how == "bar"
        self._lines = Lines(label, self.total) if how == "lines" else None
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
        elif self._lines is not None and (elapsed := self._lines.due()) is not None:
            self._lines.emit(self._lines.line(self.done, elapsed))

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


class _LineBar:
    """The extraction's progress as a log line every ``LINE_EVERY_S`` seconds (a pipe or log file)."""

    def __init__(self, total_rows: int, total_tokens: int, every: float | None = None):
        self.lines = Lines("extracting", total_rows, unit="texts", every=every)
        self.total_tokens = total_tokens
        self.rows = self.tokens = 0

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        if (elapsed := self.lines.due()) is None:
            return
        # time left from tokens where they are known: a batch of long texts costs more than one of short ones
        fraction = self.tokens / self.total_tokens if self.total_tokens else None
        rate = f"{self.rows / elapsed:,.2f} texts/s, {self.tokens / elapsed:,.0f} tokens/s"
        self.lines.emit(self.lines.line(self.rows, elapsed, fraction=fraction, extra=rate))

    def close(self) -> None:
        pass


def progress_bar(progress: bool | str | None | Callable, total_rows: int, total_tokens: int):
    """The extraction's progress: the caller's own when ``progress`` is a callable, log lines for ``"lines"``
    (``mode()`` in a pipe or log file), a Rich bar for any other true value, else none."""
    if callable(progress):
        return progress(total_rows, total_tokens)
    if progress == "lines":
        return _LineBar(total_rows, total_tokens)
    return _RichBar(total_rows, total_tokens) if progress else _NoBar()
