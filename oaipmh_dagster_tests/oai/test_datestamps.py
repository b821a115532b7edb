"""Datestamps: granularity, tolerant parsing, formatting of from/until."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oaipmh_dagster.oai import (
    Granularity,
    OAIDataError,
    format_datestamp,
    parse_datestamp,
    parse_user_datetime,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2020-01-01", datetime(2020, 1, 1, tzinfo=UTC)),
        ("2020-01-01T10:00:00Z", datetime(2020, 1, 1, 10, tzinfo=UTC)),
        (" 2020-01-01T10:00:00Z\n", datetime(2020, 1, 1, 10, tzinfo=UTC)),
        ("2020-01-01T10:00:00.123456Z", datetime(2020, 1, 1, 10, 0, 0, 123456, tzinfo=UTC)),
        ("2020-01-01T10:00:00.5Z", datetime(2020, 1, 1, 10, 0, 0, 500000, tzinfo=UTC)),
        ("2020-01-01T10:00:00+02:00", datetime(2020, 1, 1, 8, tzinfo=UTC)),
        ("2020-01-01T10:00:00-0130", datetime(2020, 1, 1, 11, 30, tzinfo=UTC)),
        ("2020-01-01T10:00:00", datetime(2020, 1, 1, 10, tzinfo=UTC)),
        ("2020-01-01 10:00:00Z", datetime(2020, 1, 1, 10, tzinfo=UTC)),
        ("2020-01-01T10:00Z", datetime(2020, 1, 1, 10, tzinfo=UTC)),
    ],
)
def test_parse_datestamp(text, expected):
    value = parse_datestamp(text)
    assert value == expected
    assert value.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    ["aaaa-bb-cc", "", "2020-13-01", "2020-02-30", "2020011", "2020-01-01T25:00:00Z", "yesterday"],
)
def test_parse_datestamp_junk(text):
    with pytest.raises(OAIDataError, match="datestamp"):
        parse_datestamp(text)
    with pytest.raises(ValueError):
        parse_datestamp(text)


def test_granularity_parse(caplog):
    assert Granularity.parse("YYYY-MM-DD") is Granularity.DAY
    assert Granularity.parse(" YYYY-MM-DDThh:mm:ssZ ") is Granularity.SECOND
    assert Granularity.parse("yyyy-mm-ddThh:mm:ssZ") is Granularity.SECOND
    with caplog.at_level(logging.WARNING):
        assert Granularity.parse(None) is Granularity.DAY
        assert Granularity.parse("weekly") is Granularity.DAY
    assert "weekly" in caplog.text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2024-03-01", datetime(2024, 3, 1, tzinfo=UTC)),
        ("2024-03-01T12:30:00", datetime(2024, 3, 1, 12, 30, tzinfo=UTC)),
        ("2024-03-01T12:30:00+01:00", datetime(2024, 3, 1, 11, 30, tzinfo=UTC)),
        ("2024-03-01T12:30:00Z", datetime(2024, 3, 1, 12, 30, tzinfo=UTC)),
        (date(2024, 3, 1), datetime(2024, 3, 1, tzinfo=UTC)),
        (datetime(2024, 3, 1, 12), datetime(2024, 3, 1, 12, tzinfo=UTC)),
        (
            datetime(2024, 3, 1, 0, 30, tzinfo=timezone(timedelta(hours=2))),
            datetime(2024, 2, 29, 22, 30, tzinfo=UTC),
        ),
    ],
)
def test_parse_user_datetime(value, expected):
    assert parse_user_datetime(value) == expected


@pytest.mark.parametrize("value", ["last week", "2024-99-01", 12, None])
def test_parse_user_datetime_rejects(value):
    with pytest.raises(ValueError, match="date"):
        parse_user_datetime(value)


def test_format_datestamp():
    dt = datetime(2024, 3, 1, 0, 30, tzinfo=timezone(timedelta(hours=2)))
    assert format_datestamp(dt, Granularity.SECOND) == "2024-02-29T22:30:00Z"
    assert format_datestamp(dt, Granularity.DAY) == "2024-02-29"
    assert format_datestamp(date(2024, 1, 5), Granularity.SECOND) == "2024-01-05T00:00:00Z"
    assert (
        format_datestamp("2024-01-05T10:00:00+00:00", Granularity.SECOND) == "2024-01-05T10:00:00Z"
    )
    assert format_datestamp(datetime(5, 1, 2, tzinfo=UTC), Granularity.DAY) == "0005-01-02"


aware = st.datetimes(
    min_value=datetime(1900, 1, 2),
    max_value=datetime(9998, 12, 30),
    timezones=st.one_of(st.just(UTC), st.none(), st.timezones()),
)


@given(aware, st.sampled_from(list(Granularity)))
def test_round_trip(value, granularity):
    text = format_datestamp(value, granularity)
    assert "+00:00" not in text
    utc = parse_user_datetime(value)
    back = parse_datestamp(text)
    if granularity is Granularity.DAY:
        assert len(text) == 10
        assert back == datetime(utc.year, utc.month, utc.day, tzinfo=UTC)
    else:
        assert text.endswith("Z") and len(text) == 20
        assert back == utc.replace(microsecond=0)
    assert format_datestamp(back, granularity) == text


@given(st.text(max_size=40))
def test_parse_datestamp_never_crashes(text):
    try:
        value = parse_datestamp(text)
    except OAIDataError:
        return
    assert value.tzinfo is UTC


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00",
                                   datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))])
def test_parse_user_datetime_out_of_range_in_utc(value):
    """An offset that carries a time past year 1 or 9999 is a ValueError that says so
    (it was an OverflowError, which the Launchpad's run config let through as a crash)."""
    with pytest.raises(ValueError, match="out of range once converted to UTC"):
        parse_user_datetime(value)
