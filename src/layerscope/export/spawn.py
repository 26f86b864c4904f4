"""Start a spawned child without running the caller's script again.

``multiprocessing``'s spawn start method re-runs the parent's ``__main__`` script in the child (as
``__mp_main__``) when it was started from a file: a user's script that calls ``export_model`` at top level,
without an ``if __name__ == "__main__":`` guard, would then export again inside the child, which
multiprocessing refuses (the child dies with "bootstrapping phase"). The child needs nothing from that
script (its target lives in layerscope), so while it starts the script's path is hidden from spawn.
"""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def main_not_rerun():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:
        yield  # `python -m ...`, a notebook or an interpreter: spawn does not re-run a file
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path
