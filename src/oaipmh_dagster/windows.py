"""Date windows for a parallel harvest: split [start, end] into inclusive windows that
respect the server's granularity (whole seconds or whole days)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from oaipmh_dagster.oai import Granularity, format_datestamp, parse_datestamp


@dataclass(frozen=True)
class Window:
    """One unit of work: a set (or None = all) and an inclusive datestamp range."""

    set_spec: str | None
    start: datetime
    end: datetime

    def key(self, granularity: Granularity) -> str:
        """Stable name in checkpoints: `set|from|until`."""
        return "|".join((self.set_spec or "", *self.bounds(granularity)))

    def bounds(self, granularity: Granularity) -> tuple[str, str]:
        """`from` and `until` as sent to the server."""
        return (format_datestamp(self.start, granularity),
                format_datestamp(self.end, granularity))

    def to_dict(self, granularity: Granularity) -> dict[str, str | None]:
        start, end = self.bounds(granularity)
        return {"set": self.set_spec, "from": start, "until": end}

    @classmethod
    def from_dict(cls, data: dict) -> Window:
        return cls(data.get("set"), parse_datestamp(data["from"]), parse_datestamp(data["until"]))


def unit(granularity: Granularity) -> timedelta:
    """The smallest step the server can tell apart."""
    return timedelta(days=1) if granularity == Granularity.DAY else timedelta(seconds=1)


def floor(dt: datetime, granularity: Granularity) -> datetime:
    """`dt` truncated to the granularity."""
    dt = dt.replace(microsecond=0)
    if granularity == Granularity.DAY:
        dt = dt.replace(hour=0, minute=0, second=0)
    return dt


def split(window: Window, parts: int, granularity: Granularity) -> list[Window]:
    """`window` cut into up to `parts` adjacent, non-overlapping inclusive windows that
    cover it exactly; a window one unit long cannot be split."""
    step = unit(granularity)
    start, end = floor(window.start, granularity), floor(window.end, granularity)
    units = (end - start) // step + 1
    parts = max(1, min(parts, units))
    out = []
    for i in range(parts):
        a = start + step * (units * i // parts)
        b = start + step * (units * (i + 1) // parts) - step
        out.append(Window(window.set_spec, a, b))
    return out
