"""Which failures of a harvest op get another attempt in the same run, and when.

A transient failure (the server or the network still failing after the client's own
retries, a truncated or HTML page, the database unreachable, another harvest holding
the lease too long) is retried by Dagster in the same run after an exponential backoff
with jitter; the retry resumes from the checkpoint of the last committed page, so it
costs the pages not yet stored. Everything else fails at once: the server's OAI-PMH
errors (badArgument, cannotDisseminateFormat, noSetHierarchy ...), bad configuration or
credentials, a sweep held back, validation and transform failures, a lease taken over,
and errors this module does not know (a bug fails the same way twice).

The op raises `dg.RetryRequested` itself rather than carrying a `dg.RetryPolicy`: a
policy also retries interrupts, so Ctrl-C, SIGTERM or a terminate from the UI would
start the harvest again after the delay instead of stopping it. The policy below only
computes the delay.

`$OAIPMH_OP_RETRIES` (default 2; 0 turns retries off) and `$OAIPMH_OP_RETRY_DELAY`
(seconds, default 30: about 30 s before the first retry, 90 s before the second, each
plus or minus 30 s) are read when the op starts."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import dagster as dg
import httpx
import sqlalchemy as sa

from oaipmh_dagster.oai import (
    BadResumptionToken,
    Cancelled,
    OAIDataError,
    OAIHTTPStatusError,
    OAITransportError,
)
from oaipmh_dagster.storage.db import DatabaseUnavailable
from oaipmh_dagster.storage.ports import HarvestInProgress, LeaseWaitCancelled

__all__ = ["DEFAULT_DELAY", "DEFAULT_RETRIES", "RETRIES_ENV", "RETRY_DELAY_ENV",
           "is_transient", "retry_policy", "retry_transient"]

RETRIES_ENV = "OAIPMH_OP_RETRIES"
RETRY_DELAY_ENV = "OAIPMH_OP_RETRY_DELAY"
DEFAULT_RETRIES = 2
DEFAULT_DELAY = 30.0
MAX_RETRIES = 10


def retry_policy(environ: Mapping[str, str] | None = None) -> dg.RetryPolicy:
    """The harvest op's retries from the environment; ValueError (one line) when bad."""
    env = os.environ if environ is None else environ
    raw_retries = env.get(RETRIES_ENV, "").strip()
    raw_delay = env.get(RETRY_DELAY_ENV, "").strip()
    try:
        retries = int(raw_retries) if raw_retries else DEFAULT_RETRIES
        delay = float(raw_delay) if raw_delay else DEFAULT_DELAY
    except ValueError:
        retries, delay = -1, -1.0
    if not 0 <= retries <= MAX_RETRIES or not 0 <= delay <= 3600:
        raise ValueError(f"${RETRIES_ENV} must be an integer in [0, {MAX_RETRIES}] and "
                         f"${RETRY_DELAY_ENV} a number of seconds in [0, 3600], not "
                         f"{raw_retries or DEFAULT_RETRIES!r} and {raw_delay or DEFAULT_DELAY!r}")
    return dg.RetryPolicy(max_retries=retries, delay=delay, backoff=dg.Backoff.EXPONENTIAL,
                          jitter=dg.Jitter.PLUS_MINUS)


def is_transient(exc: BaseException) -> bool:
    """Whether asking again later may succeed where `exc` failed."""
    if isinstance(exc, Cancelled | LeaseWaitCancelled):
        return False  # the caller is stopping
    if isinstance(exc, OAIHTTPStatusError):
        return exc.status_code >= 500 or exc.status_code in (408, 429)
    if isinstance(exc, OAITransportError | HarvestInProgress | httpx.TransportError):
        return True
    if isinstance(exc, OAIDataError):
        return exc.retryable  # a truncated or HTML page, not an unsafe or oversized one
    if isinstance(exc, BadResumptionToken):
        # An expired token: the retry resumes from the checkpoint, and the client starts
        # the list again when the server rejects that token too.
        return True
    if isinstance(exc, DatabaseUnavailable):
        return isinstance(exc.__cause__, sa.exc.OperationalError)  # not a bad URL or schema
    if isinstance(exc, sa.exc.DBAPIError):
        return isinstance(exc, sa.exc.OperationalError) or exc.connection_invalidated
    return isinstance(exc, ConnectionError | TimeoutError)


@contextmanager
def retry_transient(context: dg.AssetExecutionContext,
                    notify: Callable[[str], None] | None = None) -> Iterator[None]:
    """Run the op's body; a transient failure asks Dagster for another attempt (up to
    the policy's retries), anything else fails the op as it is. `notify` hears the
    retry's line as it is asked for (the CLI prints it)."""
    try:
        policy = retry_policy()
    except ValueError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    try:
        yield
    except dg.Failure:
        raise
    except Exception as exc:
        attempt = context.retry_number + 1  # the retry this failure would start
        if not is_transient(exc):
            context.log.info("not retried: %s is not a transient failure", type(exc).__name__)
            raise
        if attempt > policy.max_retries:
            if policy.max_retries:
                context.log.warning("transient failure, retries exhausted (%d): %s",
                                    policy.max_retries, exc)
            raise
        wait = max(0.0, float(policy.calculate_delay(attempt)))
        line = (f"transient failure: {exc}; retry {attempt} of {policy.max_retries} in "
                f"{wait:.0f} s, from the last committed page")
        context.log.warning(line)
        if notify is not None:
            notify(line)
        raise dg.RetryRequested(max_retries=policy.max_retries, seconds_to_wait=wait) from exc
