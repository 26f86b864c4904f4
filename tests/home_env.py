"""The stand-in for the user's home that the suite runs under (tests/conftest.py) and that
tests/test_home_untouched.py holds empty of anything new."""

from __future__ import annotations

from pathlib import Path


def quiet_home(home: Path) -> Path:
    """``home`` made ready to stand in for the user's: OpenVINO's own opt-out file in it (``import openvino``
    otherwise writes a telemetry client id under ``~/intel`` and sends an event)."""
    (home / "intel").mkdir(parents=True, exist_ok=True)
    (home / "intel" / "openvino_telemetry").write_text("0", encoding="utf-8")
    return home
