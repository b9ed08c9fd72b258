"""Measurements the tests make (start-up, TTFB, ...), printed in pytest's terminal summary.

A pytest plugin (tests/conftest.py registers it); tests call ``report(key, value)``.
"""

from __future__ import annotations

REPORT: dict[str, str] = {}


def report(key: str, value: str) -> None:
    REPORT[key] = value
    print(f"{key}: {value}")


def pytest_terminal_summary(terminalreporter) -> None:
    if REPORT:
        terminalreporter.write_sep("-", "chattts-serve measurements")
        for key, value in REPORT.items():
            terminalreporter.write_line(f"{key}: {value}")
