"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from sglang.srt.runtime_context import reset_context


@pytest.fixture
def clean_context():
    """A fresh runtime context for the test, and none left behind."""
    reset_context()
    yield
    reset_context()
