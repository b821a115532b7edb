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

# The forms servers send: extended (2021-03-11T10:00:00Z) or basic (20210311T100000Z)
# dates and times, ``T``, ``t`` or a space between, fractional seconds, a numeric offset,
# ``Z``, ``UTC`` or ``GMT`` or no zone (UTC). ASCII digits only.
_DATESTAMP = re.compile(
    r"""^\s*
    (?P<y>[0-9]{4})(?P<dash>-?)(?P<m>[0-9]{2})(?P=dash)(?P<d>[0-9]{2})
    (?:
        (?:[Tt]|\ +)
        (?P<H>[0-9]{2})(?P<colon>:?)(?P<M>[0-9]{2})
        (?:(?P=colon)(?P<S>[0-9]{2})(?:[.,](?P<f>[0-9]+))?)?
    )?
    \s*(?P<tz>[Zz]|UTC|GMT|[+-][0-9]{2}(?::?[0-9]{2})?)?
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


def _zone(text: str | None) -> timezone:
    if not text or text in ("Z", "z", "UTC", "GMT"):
        return UTC
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
    if minutes > 59:
        raise ValueError(f"offset minutes out of range: {text}")
    return timezone(sign * timedelta(hours=hours, minutes=minutes))


def _parse(text: str) -> datetime | None:
    m = _DATESTAMP.match(text)
    if m is None:
        return None
    try:
        tz = _zone(m["tz"])
        day = datetime(int(m["y"]), int(m["m"]), int(m["d"]), tzinfo=tz)
        if m["H"] is None:
            return day.astimezone(UTC)
        hour, minute, second = int(m["H"]), int(m["M"]), int(m["S"] or 0)
        micro = int((m["f"] or "0")[:6].ljust(6, "0"))
        if hour == 24 and minute == second == micro == 0:  # ISO 8601 end of day
            return (day + timedelta(days=1)).astimezone(UTC)
        second = 59 if second == 60 else second  # a leap second
        return day.replace(hour=hour, minute=minute, second=second, microsecond=micro).astimezone(
            UTC
        )
    except (ValueError, OverflowError):
        return None


def parse_datestamp(text: str) -> datetime:
    """Parse an OAI-PMH datestamp into an aware UTC datetime.

    Tolerates day and second granularity, the basic form (``20210311``,
    ``20210311T100000Z``), fractional seconds, a space instead of ``T``, numeric offsets
    and ``UTC``/``GMT`` (a missing zone is UTC), ``24:00:00`` and a leap second. Raises
    :class:`DatestampError` (a ``ValueError``) on anything else.
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
    try:
        return _user_datetime(value)
    except OverflowError:  # a time near year 1 or 9999 with an offset that crosses it
        raise ValueError(f"{value!r} is out of range once converted to UTC "
                         "(years 1 to 9999)") from None


def _user_datetime(value: str | date | datetime) -> datetime:
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
