"""Run one layerscope command in a child process and say what a user waiting for it meets: wall time, peak
RSS, the longest stretch without a line of output, and the lines that name an extraction or a progress count.

    python benchmarks/models/measure_cli.py [--src SRC] [--home DIR] [--out FILE.jsonl] -- run lens --model ...

``--src`` puts another checkout's ``src`` first (``before`` and ``after`` figures of one change on one machine);
``--home`` is the LAYERSCOPE_HOME of the run (its export cache and vector cache). The figures are appended to
``--out`` as one JSON line (with the 1-minute load before and after: this machine is shared). Not in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def measure(args: list[str], *, src: str | None, home: str | None) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    if home:
        env["LAYERSCOPE_HOME"] = str(Path(home).resolve())
    env["PYTHONUNBUFFERED"] = "1"
    load_before = os.getloadavg()[0]
    t0 = last = time.perf_counter()
    longest, lines, kept = 0.0, 0, []
    child = subprocess.Popen([sys.executable, "-m", "layerscope", *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert child.stdout is not None
    for line in child.stdout:
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
        lines += 1
        text = line.rstrip()
        if any(word in text for word in ("extracting", "reusing cached", "elapsed", "exporting")):
            kept.append(f"{now - t0:8.1f}s {text[:160]}")
    code = child.wait()
    end = time.perf_counter()
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"args": args, "src": src or "installed", "exit": code, "wall_s": round(end - t0, 2),
            "peak_rss_mib": round(peak_kib / 1024, 1), "output_lines": lines,
            "longest_silence_s": round(max(longest, end - last), 2),
            "extractions": sum("extracting" in k and "->" in k for k in kept), "lines_kept": kept,
            "load_1min_before": load_before, "load_1min_after": os.getloadavg()[0],
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", help="a checkout's src folder to run instead of the installed layerscope")
    parser.add_argument("--home", help="LAYERSCOPE_HOME for the run")
    parser.add_argument("--out", help="append the figures to this JSON-lines file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the layerscope arguments")
    ns = parser.parse_args()
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("give the layerscope command after --")
    figures = measure(command, src=ns.src, home=ns.home)
    text = json.dumps(figures)
    print(text)
    if ns.out:
        with open(ns.out, "a", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
