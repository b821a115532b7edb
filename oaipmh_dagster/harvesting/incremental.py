"""What a `since` means, as pure rules (no Dagster, no database, no network).

A since is the server's clock at the start of the list(s) a harvest read in full, for
one selection: (base URL, metadata prefix, sets), its *scope*. A since of another scope
says nothing about this one; a since from a clock that runs ahead of ours is not
trusted; and a remembered since is asked for a little early (the *overlap*), because
some servers stamp records after the response that could have listed them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from oaipmh_dagster.oai import Granularity, format_datestamp, parse_datestamp, parse_user_datetime

# How far ahead of our clock a date may be before it is not trusted. A since recorded from
# a server's clock is never later than ours (see `next_since`), so the overlap need not
# cover this tolerance: it covers only records a server stamps behind its own clock.
CLOCK_TOLERANCE = timedelta(minutes=10)
# Default overlap at seconds granularity; at day granularity it is one day.
OVERLAP_SECONDS = 300
_YEAR_ONE = datetime(1, 1, 1, tzinfo=UTC)


def scope(base_url: str, metadata_prefix: str, sets: Iterable[str]) -> str:
    """A short, stable fingerprint of a harvested selection (order of sets ignored)."""
    text = json.dumps([base_url.strip(), metadata_prefix, sorted(set(sets))])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def describe_scope(base_url: str, metadata_prefix: str, sets: Iterable[str]) -> str:
    """The selection in words, for logs and metadata."""
    listed = ", ".join(sorted(set(sets))) or "all sets"
    return f"{base_url} {metadata_prefix} ({listed})"


def default_overlap(granularity: Granularity) -> timedelta:
    """One granule at day granularity, a few minutes at seconds granularity."""
    if granularity == Granularity.DAY:
        return timedelta(days=1)
    return timedelta(seconds=OVERLAP_SECONDS)


def request_from(
    since: datetime, granularity: Granularity, overlap_seconds: int | None
) -> datetime:
    """The `from` to ask for a remembered `since`: a little earlier by the overlap (never
    before year 1)."""
    overlap = (default_overlap(granularity) if overlap_seconds is None
               else timedelta(seconds=overlap_seconds))
    try:
        return since - overlap
    except OverflowError:
        return _YEAR_ONE


@dataclass(frozen=True)
class SinceCheck:
    """What the one rule says of a since: `verdict` is `ok`, `ahead` (of this machine's
    clock by more than `CLOCK_TOLERANCE`), `before_earliest` (the repository's
    earliestDatestamp) or `unreadable`; `when` is the date read (None unless ok);
    `message` names the source and the value (empty when ok)."""

    verdict: str
    when: datetime | None
    message: str


def check_since(
    value: str | datetime, source: str, *, now: datetime, earliest: datetime | None = None
) -> SinceCheck:
    """The one rule for a since from any source (a server's responseDate, an operator,
    a run config, the sensor's cursor, a recorded since): a date ahead of `now` by more
    than `CLOCK_TOLERANCE`, or before `earliest` (when that is not itself ahead), is
    refused (one a little ahead is accepted: `next_since` records the earlier of a
    server's clock and ours). Never raises."""
    try:
        when = parse_user_datetime(value)
    except ValueError as exc:
        return SinceCheck("unreadable", None, f"{source}: {exc}")
    text = value if isinstance(value, str) else format_datestamp(value, Granularity.SECOND)
    stamp = format_datestamp(now, Granularity.SECOND)
    if when > now + CLOCK_TOLERANCE:
        minutes = int(CLOCK_TOLERANCE.total_seconds() // 60)
        return SinceCheck("ahead", None, f"{text} ({source}) is ahead of this machine's "
                          f"clock ({stamp}) by more than {minutes} minutes")
    if earliest is not None and earliest <= now + CLOCK_TOLERANCE and when < earliest:
        return SinceCheck("before_earliest", None, f"{text} ({source}) is before the "
                          "repository's earliestDatestamp "
                          f"{format_datestamp(earliest, Granularity.SECOND)}")
    return SinceCheck("ok", when, "")


@dataclass(frozen=True)
class NextSince:
    """The since a harvest may record, and why it is what it is."""

    value: str | None  # None: the harvest must not move since
    note: str  # empty when the list start was taken as it is


def next_since(
    list_start: datetime | None,
    granularity: Granularity,
    *,
    previous: str | None,
    now: datetime | None = None,
    earliest: datetime | None = None,
    resumed_start: datetime | None = None,
) -> NextSince:
    """The since to record after reading lists that started at `list_start` (server
    clock; `now` is ours at that moment, `resumed_start` the trusted start of an earlier
    list the harvest continued). `check_since` judges the server's clock: a start a
    little ahead of ours is clamped to ours (so a server up to `CLOCK_TOLERANCE` ahead
    loses no change, whatever the overlap); one it refuses is not recorded: the
    `previous` since is kept, or, without one, our clock in the server's granularity."""
    now = now or datetime.now(UTC)
    if list_start is None:
        return NextSince(None, "the harvest read no list")
    check = check_since(list_start, "the server's responseDate", now=now, earliest=earliest)
    if resumed_start is not None:
        resumed = check_since(resumed_start, "the interrupted list's start", now=now,
                              earliest=earliest)
        if resumed.when is None:
            check = resumed
        elif check.when is not None:
            check = replace(check, when=min(check.when, resumed.when))
        else:  # the resumed list's start is ours, or a server's we trusted
            value = format_datestamp(min(resumed.when, now), granularity)
            return NextSince(value, f"{check.message}; recording {value} (the interrupted "
                             "list's start) instead")
    if check.when is None:
        fallback = previous or format_datestamp(now, granularity)
        return NextSince(fallback, f"{check.message}; recording {fallback} instead")
    return NextSince(format_datestamp(min(check.when, now), granularity), "")


def trusted_start(response_date: datetime, now: datetime, earliest: datetime | None) -> datetime:
    """The start of a list as a checkpoint keeps it: the server's clock when
    `check_since` accepts it (clamped to ours), else ours."""
    check = check_since(response_date, "the server's responseDate", now=now, earliest=earliest)
    return min(check.when or now, now)


def is_later(a: str | None, b: str | None) -> bool:
    """Whether datestamp `b` is later than `a` (unreadable values are never later)."""
    if not b:
        return False
    if not a:
        return True
    try:
        return parse_datestamp(b) > parse_datestamp(a)
    except ValueError:
        return False


def readable(value: object) -> str | None:
    """`value` as a datestamp string when it is one a server or an operator could mean
    (`YYYY-MM-DD` or `YYYY-MM-DDThh:mm:ssZ`), else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parse_datestamp(value)
    except ValueError:
        return None
    return value


@dataclass(frozen=True)
class SinceState:
    """The since in force for a harvester and where it came from."""

    value: str | None  # None: the next harvest is full
    scope: str | None  # the selection it belongs to (None: any, an unscoped legacy value)
    operator: bool  # set by an operator (CLI or cursor edit), not by a run
    at: float  # when it was recorded (epoch seconds)
    source: str  # e.g. "run 1a2b3c4d", "operator", "reset"


def after_run(
    current: SinceState | None, value: str | None, run_scope: str | None,
    run_started: float, at: float, source: str,
) -> SinceState | None:
    """The state after a successful run that recorded `value` for `run_scope`, or None
    when the run changes nothing: it started before an operator's edit (it harvested
    from the since the operator replaced), or it would move since backwards (unless the
    since in force is later than the run's start: see `_after`)."""
    if value is None:
        return None
    if current is not None and current.operator and run_started < current.at:
        return None
    if (current is not None and current.value and current.scope == run_scope
            and not is_later(current.value, value) and not _after(current.value, run_started)):
        return None
    return SinceState(value, run_scope, False, at, source)


def _after(value: str, when: float) -> bool:
    """Whether datestamp `value` is later than epoch `when`: a since ahead of the start of
    a run (which asked from its own clock or harvested in full, see `check_since`) is
    replaced by what that run records, even an earlier date."""
    try:
        return parse_datestamp(value) > datetime.fromtimestamp(when, UTC)
    except (ValueError, OverflowError, OSError):
        return False


def in_force(state: SinceState | None, current_scope: str) -> tuple[str | None, str]:
    """The since that applies to a harvester whose selection is `current_scope`, and a
    note when a recorded one does not apply."""
    if state is None or not state.value:
        return None, ""
    if state.scope is not None and state.scope != current_scope:
        return None, (f"the since {state.value} was recorded for another URL, prefix or "
                      "sets than the harvester has now: harvesting in full")
    return state.value, ""
