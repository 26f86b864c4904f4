"""Fixtures shared by the extraction tests."""

from __future__ import annotations

import pytest

import fake_engine


@pytest.fixture(scope="module")
def fake():
    """The test-only ``fake`` engine, registered for the module that asks for it and removed after it."""
    fake_engine.register_fake()
    yield
    fake_engine.unregister_fake()
