"""The freshness policy of a harvester's `raw_records`, derived from its cron: the
asset turns WARN once the harvest of a tick is a quarter of the cron's period late, and
FAIL once a whole period passed without one (two ticks without a successful harvest).
Dagster's freshness daemon evaluates it; the catalog and the asset page show the state.

A time window rather than Dagster's cron policy: building that one samples a thousand
ticks of every distinct cron string (about 20 ms each), which at a thousand staggered
harvesters would double the code location's load time."""

from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import dagster as dg
from croniter import croniter

from oaipmh_dagster.storage.registry import Harvester

__all__ = ["cron_period", "freshness_policy"]

# Sampling starts in a leap year and covers more than a year (monthly, yearly and
# leap-day crons), or this many ticks for crons that fire every few minutes.
_ANCHOR = datetime(2024, 1, 1)
_SPAN = timedelta(days=400)
_MAX_TICKS = 1500
_NUMBER = re.compile(r"\d+")


def freshness_policy(h: Harvester) -> dg.FreshnessPolicy | None:
    """The policy of an enabled harvester with a cron; none otherwise (nothing to expect)."""
    if not h.cron or not h.enabled:
        return None
    return _policy(cron_period(h.cron, h.timezone))


def cron_period(cron: str, timezone: str = "UTC") -> timedelta:
    """The longest time between two consecutive ticks of `cron` in `timezone`."""
    return _period(_normalized(cron), timezone)


@functools.cache
def _policy(period: timedelta) -> dg.FreshnessPolicy:
    return dg.FreshnessPolicy.time_window(fail_window=2 * period,
                                          warn_window=period + period / 4)


def _normalized(cron: str) -> str:
    """`cron` with a single minute and a single hour moved to 0: every tick shifts by the
    same time of day, so the gaps stay; staggered crons ("17 4 * * *") share one entry."""
    fields = cron.split()
    if len(fields) == 5:
        for i in (0, 1):
            if _NUMBER.fullmatch(fields[i]):
                fields[i] = "0"
    return " ".join(fields)


@functools.cache
def _period(cron: str, timezone: str) -> timedelta:
    ticks = croniter(cron, _ANCHOR.replace(tzinfo=ZoneInfo(timezone)))
    previous = ticks.get_next(datetime)
    end = previous + _SPAN
    longest = timedelta(0)
    for _ in range(_MAX_TICKS):
        current = ticks.get_next(datetime)
        longest = max(longest, current - previous)
        if current > end:
            break
        previous = current
    return max(longest, timedelta(minutes=1))
