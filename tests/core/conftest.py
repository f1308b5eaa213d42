"""Fixtures of the core tests."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture
def deadline():
    """A hang (a FIFO opened without O_NONBLOCK, an endless device read) fails the test instead of blocking."""
    def expire(*_):
        raise TimeoutError("the read did not return within 5 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
