"""How long a test waits for a process of its own before calling it hung.

A test judges what a process does (its output, its memory), never how fast: on a loaded machine (a load of
30-40 on two cores) an honest run takes many times its usual minutes. ``HANG_S`` is only a guard against a
process that never ends, far above the slowest honest run; ``LAYERSCOPE_TEST_HANG_S`` sets another."""

from __future__ import annotations

import os

HANG_S = float(os.environ.get("LAYERSCOPE_TEST_HANG_S", 4 * 3600))
