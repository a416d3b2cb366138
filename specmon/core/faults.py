"""How specmon reports bad input: each fault names the file, the line and the field."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    file: str
    line: int
    field: str
    reason: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: field '{self.field}': {self.reason}" if self.field else f"{where}: {self.reason}"

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "field": self.field, "reason": self.reason}


class RowFault(ValueError):
    """A fault in one record, before it is placed in a file and line."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class SpecmonError(Exception):
    """An error to show the user as it is (no traceback): a missing file, a locked or too-new database."""
