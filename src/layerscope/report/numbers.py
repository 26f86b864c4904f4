"""Figures as report text: fixed decimals for tables, significant digits for prose, a 95% interval."""

from __future__ import annotations


def num(value, digits: int = 4, *, sign: bool = False) -> str:
    """A figure with ``digits`` decimals for a table: "undefined" for None or NaN, and never a negative zero
    (-0.0001 at 3 decimals is "0.000", not "-0.000"); ``sign`` puts "+" before positive figures."""
    if value is None or value != value:
        return "undefined"
    text = f"{value:{'+' if sign else ''}.{digits}f}"
    if text.lstrip("+-").strip("0.") == "":  # rounds to zero: no sign
        text = text.lstrip("+-")
    return text


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "undefined"
    if isinstance(value, float):
        return num(value, digits)
    return str(value)


def p_value(value) -> str:
    """A p-value for a table: four decimals, in scientific notation below 0.001, "< 1e-300" where it
    underflowed to 0 (far beyond chance), "undefined" for None."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "undefined" if value is None else str(value)
    if value == 0.0:
        return "< 1e-300"
    return f"{value:.1e}" if value < 1e-3 else f"{value:.4f}"


def sig(value, digits: int = 3) -> str:
    """A figure with ``digits`` significant digits for prose (27.481466671788475 -> 27.5, 0.012345 -> 0.0123);
    whole numbers of more digits are rounded to an integer, never put in scientific notation."""
    if value is None:
        return "undefined"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:.0f}"
    if abs(value) < 1e-4:
        return f"{value:.{max(0, digits - 1)}e}"
    text = f"{value:#.{digits}g}"
    return text.rstrip(".") if "e" not in text else text


def ci(low, high, digits: int = 3) -> str:
    """`` [low, high]`` for a 95% interval, or "" where there is none."""
    if low is None or high is None:
        return ""
    return f" [{sig(low, digits)}, {sig(high, digits)}]"
