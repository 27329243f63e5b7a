"""One difference found by any of the ABI checks, as the report lists it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Difference:
    check: str      # "layout", "enumerator", "missing", "prototype", "typedef", "field type", "headers", "export"
    message: str

    def __str__(self) -> str:
        return self.message
