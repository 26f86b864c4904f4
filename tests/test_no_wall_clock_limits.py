"""No test fails because the machine is slow: a process a test starts is waited for up to ``HANG_S``
(tests/hang_guard.py, a hang guard far above the slowest honest run), never a few minutes written into the
test, and no test asserts on elapsed seconds. Read from the tests' own source."""

from __future__ import annotations

import ast
from pathlib import Path

from hang_guard import HANG_S

TESTS = Path(__file__).resolve().parent
WAITS = {"run", "communicate", "wait", "check_output", "check_call", "call"}  # subprocess's waiting calls
SHORT = 60  # a literal wait at or under this is for something instant (a killed process, a socket)


def _waits(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WAITS:
            for kw in node.keywords:
                if kw.arg == "timeout" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, (int, float)):
                    yield node.lineno, kw.value.value


def _timed(tree: ast.AST):
    """Assertions comparing a clock difference (``time.perf_counter() - t0 < 10``)."""
    clocks = {"perf_counter", "time", "monotonic"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            for sub in ast.walk(node.test):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub) and isinstance(sub.left, ast.Call) \
                        and isinstance(sub.left.func, ast.Attribute) and sub.left.func.attr in clocks:
                    yield node.lineno


def test_no_test_waits_a_fixed_few_minutes_or_times_the_machine():
    """Catches: a subprocess given a fixed limit of minutes (it fails at a load of 30-40 on two cores with nothing
    wrong), an assertion on elapsed seconds."""
    assert HANG_S >= 3600
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        rel = path.relative_to(TESTS)
        problems += [f"{rel}:{line}: timeout={value} (use hang_guard.HANG_S)" for line, value in _waits(tree)
                     if value > SHORT]
        problems += [f"{rel}:{line}: asserts on elapsed seconds" for line in _timed(tree)]
    assert not problems, "\n".join(problems)
