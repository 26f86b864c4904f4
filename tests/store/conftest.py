"""Fixtures shared by the store tests."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest


@pytest.fixture
def tmpfs(tmp_path):
    """Factory: ``tmpfs("2m") -> Path`` of a size-limited tmpfs mounted under ``tmp_path``, unmounted (lazily,
    so a file still open there does not keep it) after the test. Mounting needs root and mount rights; the
    test is skipped elsewhere, saying why."""
    mounted = []

    def mount(size: str):
        if os.geteuid() != 0:
            pytest.skip("mounting a size-limited tmpfs needs root")
        mnt = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
        mnt.mkdir()
        made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode(errors='replace').strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
