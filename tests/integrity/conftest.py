"""The step count report of the integrity model test (the long mode prints how many steps
it checked)."""
from __future__ import annotations

from tests.integrity import counters


def pytest_terminal_summary(terminalreporter):
    if counters.TOTAL["steps"]:
        terminalreporter.write_line(
            "integrity model: " + ", ".join(f"{k}={v}" for k, v in counters.TOTAL.items()))
