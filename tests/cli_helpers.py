"""Run the layerscope CLI in-process and collect what it printed and the exit code it chose."""

from __future__ import annotations

import hashlib
from pathlib import Path

from layerscope.cli import main


def sha(path) -> str:
    """The sha256 of a file's bytes, to show a user's file unchanged."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cli_output(args, capsys) -> tuple[int, str, str]:
    """``(exit code, stdout, stderr)`` of ``layerscope ARGS`` (0 when main returns without exiting)."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def run_cli(args, capsys) -> tuple[int, str]:
    """``(exit code, stdout + stderr)`` of ``layerscope ARGS``."""
    code, out, err = cli_output(args, capsys)
    return code, out + err


def one_error(code: int, text: str, *needles: str) -> str:
    """Exit 2 with exactly one ``error:`` line, no traceback, and every needle in the flattened text."""
    assert code == 2, text
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    flat = " ".join(text.split())
    for needle in needles:
        assert needle in flat, (needle, text)
    return flat
