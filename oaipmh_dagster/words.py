"""Values in words for people: counts with their noun, lists, flags and datestamps as an
operator reads them (`--json` output never goes through here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["count", "datestamp", "human"]


def count(n: int, one: str, many: str | None = None) -> str:
    """`1 record`, `2 records`; `many` for irregular plurals (`retry`, `retries`)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def human(value: object, empty: str = "-") -> str:
    """A value as a cell: lists joined with commas, flags yes/no, nothing as `empty`."""
    if value is None or value == "" or (isinstance(value, Sequence | Mapping)
                                       and not isinstance(value, str) and not value):
        return empty
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={human(v)}" for k, v in value.items())
    if isinstance(value, Sequence) and not isinstance(value, str):
        return ", ".join(human(v) for v in value)
    return str(value)


def datestamp(value: str | None) -> str:
    """An ISO 8601 UTC datestamp, as a date when it is midnight (what a day-granularity
    server's datestamp becomes once stored)."""
    if not value:
        return "-"
    return value.removesuffix("T00:00:00Z")
