"""What the benchmark scripts share: the texts they time (STS sentences or seeded synthetic ones) and the
clock around their passes. A script in a folder below imports it after putting this folder on ``sys.path``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Callable


def add_text_options(ap: argparse.ArgumentParser, synthetic: int) -> None:
    """The export to time, where its texts come from, and how many timed passes."""
    ap.add_argument("export")
    ap.add_argument("--sts", help="STS Benchmark csv: its sentences are the texts")
    ap.add_argument("--synthetic", type=int, help=f"N seeded synthetic texts instead (default {synthetic})")
    ap.add_argument("--passes", type=int, default=3, help="timed passes (the best one counts)")
    ap.set_defaults(synthetic_default=synthetic)


def texts_of(args: argparse.Namespace) -> list[str]:
    """Both sentences of every STS pair, or ``--synthetic`` seeded synthetic texts."""
    if args.sts:
        from layerscope.data.pairs import read_sts

        s1, s2, _ = read_sts(args.sts)
        return list(s1) + list(s2)
    from layerscope.data.synthetic import synthetic_texts

    return synthetic_texts(args.synthetic or args.synthetic_default, seed=0)


def timed_passes(passes: int, run: Callable[[], Any]) -> tuple[list[float], list[float], Any]:
    """Call ``run`` ``passes`` times: each pass's wall seconds and this process's CPU seconds, and what the last
    pass returned."""
    walls, cpus, out = [], [], None
    for _ in range(passes):
        w, c = time.perf_counter(), time.process_time()
        out = run()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return walls, cpus, out


def print_and_save(record: dict[str, Any], out: Path | None) -> None:
    """A script's JSON record on standard output, and in ``out`` where given."""
    text = json.dumps(record, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n", encoding="utf-8")
