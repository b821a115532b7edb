"""OAI-PMH datestamps: granularity, tolerant parsing, formatting of from/until."""

from __future__ import annotations

import enum
import logging
import re
from datetime import UTC, date, datetime, timedelta, timezone

from .errors import DatestampError

__all__ = [
    "Granularity",
    "parse_datestamp",
    "parse_user_datetime",
    "format_datestamp",
    "to_utc",
]

_log = logging.getLogger("oaipmh_dagster.oai")

_DATESTAMP = re.compile(
    r"""^\s*
    (?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})
    (?:[Tt\ ]
        (?P<H>\d{2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:[.,](?P<f>\d+))?)?
        \s*(?P<tz>[Zz]|[+-]\d{2}(?::?\d{2})?)?
    )?
    \s*$""",
    re.VERBOSE,
)


class Granularity(enum.Enum):
    """The datestamp granularity a repository advertises in Identify."""

    DAY = "YYYY-MM-DD"
    SECOND = "YYYY-MM-DDThh:mm:ssZ"

    @classmethod
    def parse(cls, text: str | None, logger: logging.Logger | None = None) -> Granularity:
        """Read a granularity tolerantly; unknown or missing gives DAY with a warning."""
        value = (text or "").strip()
        if value == cls.SECOND.value or "hh" in value.lower():
            return cls.SECOND
        if value == cls.DAY.value or value.upper() == cls.DAY.value:
            return cls.DAY
        (logger or _log).warning(
            f"unknown datestamp granularity {value!r}; using day granularity (YYYY-MM-DD)"
        )
        return cls.DAY


def to_utc(value: datetime) -> datetime:
    """Make a datetime UTC-aware (a naive one is taken as UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _parse(text: str) -> datetime | None:
    m = _DATESTAMP.match(text)
    if m is None:
        return None
    try:
        year, month, day = int(m["y"]), int(m["m"]), int(m["d"])
        if m["H"] is None:
            return datetime(year, month, day, tzinfo=UTC)
        micro = int((m["f"] or "0")[:6].ljust(6, "0"))
        tz: timezone = UTC
        offset = m["tz"]
        if offset and offset not in "Zz":
            sign = -1 if offset[0] == "-" else 1
            digits = offset[1:].replace(":", "")
            minutes = int(digits[:2]) * 60 + int(digits[2:4] or 0)
            tz = timezone(sign * timedelta(minutes=minutes))
        dt = datetime(
            year, month, day, int(m["H"]), int(m["M"]), int(m["S"] or 0), micro, tzinfo=tz
        )
        return dt.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def parse_datestamp(text: str) -> datetime:
    """Parse an OAI-PMH datestamp into an aware UTC datetime.

    Tolerates day and second granularity, fractional seconds, a space instead of
    ``T`` and numeric offsets (a missing zone is UTC). Raises :class:`DatestampError`
    (a ``ValueError``) on anything else.
    """
    if not isinstance(text, str):
        raise DatestampError(f"datestamp must be a string, not {type(text).__name__}")
    dt = _parse(text)
    if dt is None:
        raise DatestampError(f"not an OAI-PMH datestamp: {text!r}")
    return dt


def parse_user_datetime(value: str | date | datetime) -> datetime:
    """Read a user-supplied date/datetime (string or object) as an aware UTC datetime.

    A date means midnight UTC; a naive datetime is taken as UTC.
    """
    if isinstance(value, datetime):
        return to_utc(value)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if isinstance(value, str):
        dt = _parse(value)
        if dt is None:
            try:
                dt = to_utc(datetime.fromisoformat(value.strip()))
            except ValueError:
                dt = None
        if dt is None:
            raise ValueError(
                f"cannot read {value!r} as a date or datetime "
                "(expected e.g. 2024-01-31, 2024-01-31T12:00:00Z or 2024-01-31T13:00:00+01:00)"
            )
        return dt
    raise ValueError(f"expected a date, datetime or string, not {type(value).__name__}")


def format_datestamp(value: datetime | date | str, granularity: Granularity) -> str:
    """Format a point in time for from/until at the server's granularity (UTC, ``Z``)."""
    dt = parse_user_datetime(value)
    text = f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}"
    if granularity is Granularity.SECOND:
        text += f"T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}Z"
    return text
