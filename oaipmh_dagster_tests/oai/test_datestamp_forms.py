"""Datestamps in the forms real servers send: each reads as one UTC instant, or None."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oaipmh_dagster.oai import DatestampError, Header, parse_datestamp

T = datetime(2021, 3, 11, 10, 0, tzinfo=UTC)
DAY = datetime(2021, 3, 11, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2021-03-11", DAY),
        ("2021-03-11T10:00:00Z", T),
        ("2021-03-11T10:00:00.250Z", T.replace(microsecond=250000)),
        ("2021-03-11T10:00:00,5Z", T.replace(microsecond=500000)),
        ("2021-03-11T10:00:00.1234567891Z", T.replace(microsecond=123456)),
        ("2021-03-11T11:00:00+01:00", T),
        ("2021-03-11T15:45:00+05:45", T),
        ("2021-03-11T05:00:00-0500", T),
        ("2021-03-11T12:00:00+02", T),
        ("2021-03-11T10:00:00", T),
        ("2021-03-11T10:00", T),
        ("2021-03-11t10:00:00z", T),
        ("2021-03-11 10:00:00", T),
        ("2021-03-11 10:00:00 UTC", T),
        ("2021-03-11T10:00:00 GMT", T),
        ("20210311", DAY),
        ("20210311T100000Z", T),
        ("20210311T110000+0100", T),
        ("2021-03-11Z", DAY),
        ("\n      2021-03-11T10:00:00Z\n    ", T),
        ("2021-03-10T24:00:00Z", DAY),
        ("2016-12-31T23:59:60Z", datetime(2016, 12, 31, 23, 59, 59, tzinfo=UTC)),
        ("1969-12-31T19:00:00-05:00", datetime(1970, 1, 1, tzinfo=UTC)),
    ],
)
def test_real_world_forms_read_as_utc(text: str, expected: datetime) -> None:
    value = parse_datestamp(text)
    assert value == expected and value.tzinfo is UTC
    assert Header("i", text).datestamp_utc == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "yesterday",
        "aaaa-bb-cc",
        "9/9/2025 12:13:58 PM",
        "2021-13-01",
        "2021-02-30",
        "2021-03-11T25:00:00Z",
        "2021-03-11T24:30:00Z",
        "2021-03-11T10:61:00Z",
        "2021-03-11T10:00:00+25:00",
        "2021-03-11T10:00:00+01:75",
        "2021-0311",
        "202103-11",
        "2021031",
        "2021-03-11T10:00:00ZZ",
        "2021-03-11T10:00:00Z&bogus;",
        "１２３４-01-01",
    ],
)
def test_unreadable_datestamps_are_recognisable(text: str) -> None:
    with pytest.raises(DatestampError):
        parse_datestamp(text)
    assert Header("i", text).datestamp_utc is None


def _forms(dt: datetime) -> list[tuple[str, datetime]]:
    """Ways servers write the instant `dt` (aware), each with the instant it denotes."""
    utc = dt.astimezone(UTC)
    whole = utc.replace(microsecond=0)
    off = dt.utcoffset() or timedelta(0)
    sign = "-" if off < timedelta(0) else "+"
    minutes = abs(int(off.total_seconds())) // 60
    hhmm = f"{minutes // 60:02d}:{minutes % 60:02d}"
    local = dt.replace(microsecond=0)
    return [
        (utc.strftime("%Y-%m-%d"), utc.replace(hour=0, minute=0, second=0, microsecond=0)),
        (utc.strftime("%Y%m%d"), utc.replace(hour=0, minute=0, second=0, microsecond=0)),
        (whole.strftime("%Y-%m-%dT%H:%M:%SZ"), whole),
        (whole.strftime("%Y-%m-%dT%H:%M:%S"), whole),
        (whole.strftime("%Y-%m-%d %H:%M:%S"), whole),
        (whole.strftime("%Y%m%dT%H%M%SZ"), whole),
        (utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), utc),
        (local.strftime("%Y-%m-%dT%H:%M:%S") + sign + hhmm, whole),
        (local.strftime("%Y-%m-%dT%H:%M:%S") + sign + hhmm.replace(":", ""), whole),
    ]


@given(
    moment=st.datetimes(
        min_value=datetime(1000, 1, 2), max_value=datetime(9998, 12, 30),
        timezones=st.sampled_from([UTC]),
    ),
    offset_minutes=st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59),
)
def test_every_form_reads_back_as_the_same_instant(moment: datetime, offset_minutes: int) -> None:
    local = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    for text, expected in _forms(local):
        assert parse_datestamp(text) == expected, text


@given(st.text(max_size=40))
def test_any_text_reads_or_is_refused_cleanly(text: str) -> None:
    try:
        value = parse_datestamp(text)
    except DatestampError:
        assert Header("i", text).datestamp_utc is None
    else:
        assert value.tzinfo is UTC
        assert Header("i", text).datestamp_utc == value
