"""Fixtures shared by the store tests."""

from __future__ import annotations

import uuid

import pytest
from mounts import mount_or_skip, unmount_all


@pytest.fixture
def tmpfs(tmp_path):
    """Factory: ``tmpfs("2m") -> Path`` of a size-limited tmpfs mounted under ``tmp_path``, unmounted after the
    test (lazily, so a file still open there does not keep it); skipped where mounting is not permitted."""
    mounted = []

    def mount(size: str):
        where = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
        mounted.append(mount_or_skip(["-t", "tmpfs", "-o", f"size={size}", "tmpfs"], where, "a size-limited tmpfs"))
        return where

    yield mount
    unmount_all(mounted)
