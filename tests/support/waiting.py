"""Waiting in tests: bench/lib/waiting.py, the one wait of the bench and the tests."""

from bench.lib.waiting import NotMet, wait_until, wait_until_async  # noqa: F401  (re-exported for the tests)
