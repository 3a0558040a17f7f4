"""Protocol errors raised by op handlers; the COMPOUND loop turns them into results."""
from __future__ import annotations


class NfsError(Exception):
    """An NFSv4 status (nfsstat4 value) for the current op."""

    def __init__(self, status: int, detail: str = ""):
        super().__init__(status, detail)
        self.status = status
        self.detail = detail
