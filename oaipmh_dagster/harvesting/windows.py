"""Date windows for a parallel harvest: split [start, end] into inclusive windows that
respect the server's granularity (whole seconds or whole days). The outermost windows
may be open-ended (no `from` or no `until` sent), so records dated outside the range
the server advertises are harvested too."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from oaipmh_dagster.oai import Granularity, format_datestamp, parse_datestamp


@dataclass(frozen=True)
class Window:
    """One unit of work: a set (or None = all) and an inclusive datestamp range; an
    open side is not sent to the server (`start`/`end` then only guide splitting)."""

    set_spec: str | None
    start: datetime
    end: datetime
    open_start: bool = False
    open_end: bool = False

    def key(self, granularity: Granularity) -> str:
        """Stable name in checkpoints: `set|from|until` (`*` for an open side)."""
        start, end = self.bounds(granularity)
        return "|".join((self.set_spec or "", start or "*", end or "*"))

    def bounds(self, granularity: Granularity) -> tuple[str | None, str | None]:
        """`from` and `until` as sent to the server (None: not sent)."""
        return (None if self.open_start else format_datestamp(self.start, granularity),
                None if self.open_end else format_datestamp(self.end, granularity))

    def to_dict(self, granularity: Granularity) -> dict[str, str | bool | None]:
        return {"set": self.set_spec, "from": format_datestamp(self.start, granularity),
                "until": format_datestamp(self.end, granularity),
                "open_start": self.open_start, "open_end": self.open_end}

    @classmethod
    def from_dict(cls, data: dict) -> Window:
        return cls(data.get("set"), parse_datestamp(data["from"]),
                   parse_datestamp(data["until"]), bool(data.get("open_start")),
                   bool(data.get("open_end")))


@dataclass
class WindowState:
    """A window of a parallel harvest and where its list stands (`token`: the next page
    to ask for; `key`: its name in checkpoints)."""

    window: Window
    key: str
    token: str | None = None
    done: bool = False
    depth: int = 0


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
    cover it exactly (the first keeps an open start, the last an open end); a window
    one unit long cannot be split."""
    step = unit(granularity)
    start, end = floor(window.start, granularity), floor(window.end, granularity)
    end = max(start, end)  # a since after the server's clock still gets one window
    units = (end - start) // step + 1
    parts = max(1, min(parts, units))
    out = []
    for i in range(parts):
        a = start + step * (units * i // parts)
        b = start + step * (units * (i + 1) // parts) - step
        out.append(Window(window.set_spec, a, b))
    out[0] = replace(out[0], open_start=window.open_start)
    out[-1] = replace(out[-1], open_end=window.open_end)
    return out
