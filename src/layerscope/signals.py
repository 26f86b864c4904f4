"""Signals in layerscope's processes: SIGTERM stops a command-line run the way Ctrl-C does, in that process only.

``sigterm_stops(handler)`` installs the command line's SIGTERM handler for the length of a run (cli/__init__.py).
No other process ever runs it:

- a process forked while it is installed (by a library: multiprocessing's default start method on Linux, a
  helper process of a dependency) starts with SIGTERM's default action (an ``os.register_at_fork`` hook), so a
  library that stops its helper with SIGTERM stops it, instead of a KeyboardInterrupt traceback in the output;
- the processes layerscope starts itself (the tokenizer pool, the image workers, the export's tracing child,
  the bench's rows; spawned, so they keep no Python handler of ours) call ``child_start()`` first: SIGTERM's
  default action, and Ctrl-C ignored. Ctrl-C at a terminal reaches every process of the foreground group; the
  parent alone answers it (it stops its children and says what was kept), so no child prints a traceback of
  its own. Ray's actors are started by Ray's own processes and inherit nothing from ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Callable, Iterator

_INSTALLED: list[Callable] = []  # the handler sigterm_stops installed, while a run holds it
_HOOKED: list[bool] = []


def _after_fork_in_child() -> None:
    if _INSTALLED and signal.getsignal(signal.SIGTERM) is _INSTALLED[-1]:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _INSTALLED.clear()


@contextlib.contextmanager
def sigterm_stops(handler: Callable) -> Iterator[None]:
    """``handler`` answers SIGTERM while the block runs, in this process and in no process forked from it;
    the previous handler afterwards. Outside the main thread (where Python allows no handler) it does
    nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _HOOKED:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _HOOKED.append(True)
    previous = signal.signal(signal.SIGTERM, handler)
    _INSTALLED.append(handler)
    try:
        yield
    finally:
        _INSTALLED.remove(handler)
        signal.signal(signal.SIGTERM, previous)


def child_start() -> None:
    """The first thing a process layerscope starts does: SIGTERM's default action (its parent stops it that
    way), Ctrl-C ignored (its parent answers it)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
