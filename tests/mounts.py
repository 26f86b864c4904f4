"""Real mounts for tests that need one (a size-limited tmpfs, a bind mount): made, or the test skipped saying
why (mounting needs root and mount rights), and unmounted lazily at the end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def mount_or_skip(args: list[str], where: Path, what: str) -> Path:
    """``mount ARGS WHERE`` (``where`` is made first), or skip the test: ``what`` names the mount in the reason."""
    if os.geteuid() != 0:
        pytest.skip(f"{what} needs root")
    where.mkdir(parents=True)
    done = subprocess.run(["mount", *args, str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"{what} is not permitted here: {done.stderr.strip()}")
    return where


def unmount_all(mounted: list[Path]) -> None:
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)
