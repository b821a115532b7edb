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
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from oaipmh_dagster.oai import Granularity, format_datestamp, parse_datestamp

# How far ahead of our clock a server's responseDate may be before it is not trusted.
CLOCK_TOLERANCE = timedelta(minutes=10)
# Default overlap at seconds granularity; at day granularity it is one day.
OVERLAP_SECONDS = 300


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
    """The `from` to ask for a remembered `since`: a little earlier by the overlap."""
    overlap = (default_overlap(granularity) if overlap_seconds is None
               else timedelta(seconds=overlap_seconds))
    return since - overlap


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
) -> NextSince:
    """The since to record after reading lists that started at `list_start` (server
    clock). A start later than our clock (beyond `CLOCK_TOLERANCE`) is not trusted: the
    previous since is kept, or, without one, our clock in the server's granularity."""
    now = now or datetime.now(UTC)
    if list_start is None:
        return NextSince(None, "the harvest read no list")
    if list_start > now + CLOCK_TOLERANCE:
        fallback = previous or format_datestamp(now, granularity)
        return NextSince(
            fallback,
            f"the server's responseDate {format_datestamp(list_start, granularity)} is "
            f"ahead of this machine's clock ({format_datestamp(now, granularity)}); "
            f"recording {fallback} instead",
        )
    return NextSince(format_datestamp(list_start, granularity), "")


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
    from the since the operator replaced), or it would move since backwards."""
    if value is None:
        return None
    if current is not None and current.operator and run_started < current.at:
        return None
    if (current is not None and current.value and current.scope == run_scope
            and not is_later(current.value, value)):
        return None
    return SinceState(value, run_scope, False, at, source)


def in_force(state: SinceState | None, current_scope: str) -> tuple[str | None, str]:
    """The since that applies to a harvester whose selection is `current_scope`, and a
    note when a recorded one does not apply."""
    if state is None or not state.value:
        return None, ""
    if state.scope is not None and state.scope != current_scope:
        return None, (f"the since {state.value} was recorded for another URL, prefix or "
                      "sets than the harvester has now: harvesting in full")
    return state.value, ""
