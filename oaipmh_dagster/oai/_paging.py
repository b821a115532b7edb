"""Paging: following a list's resumptionTokens.

One layer owns what a token chain needs: loop detection in constant memory, a bound on
pages that carry a token but no records, one restart from the list's original
arguments when the server rejects a token (badResumptionToken), and fetching page n+1
in a background thread while page n is consumed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from oaipmh_dagster.stopping import Stop

from ._deadline import CancelScope, bind_scope
from ._options import LoggerLike
from .errors import BadResumptionToken, NoRecordsMatch, OAIDataError
from .models import Page, ResumptionToken

__all__ = ["LoopDetector", "follow_tokens", "prefetched"]

T = TypeVar("T")

Fetch = Callable[[dict[str, str], str | None], tuple[T, ResumptionToken | None, int]]
"""Fetch one page: (request params, the token asked with) -> (item, its token, records)."""


def follow_tokens(
    fetch: Fetch[T],
    verb: str,
    args: dict[str, str],
    start_token: str | None,
    *,
    url_for: Callable[[dict[str, str]], str],
    log: logging.Logger | LoggerLike,
    max_empty_pages: int,
    can_restart: bool = True,
) -> Iterator[tuple[T, ResumptionToken | None]]:
    """Follow resumptionTokens: loop detection, empty pages, one restart on a bad token.

    `start_token` starts mid-list (a checkpoint's token); when the server rejects it, or
    any later token, the list restarts once from `args` (unless `can_restart` is False)."""
    token = start_token
    loops = LoopDetector()
    empty = 0
    restarted = False
    first = True
    while True:
        params = {"verb": verb, "resumptionToken": token} if token else args
        try:
            item, rt, count = fetch(params, token)
        except NoRecordsMatch:
            if token:
                log.warning(
                    f"noRecordsMatch in the middle of a list at {url_for(params)}; "
                    "taking it as the end"
                )
            return
        except BadResumptionToken as exc:
            if not token or restarted or not can_restart:
                raise
            _restarting(log, exc, token, first, url_for(args))
            token, loops, empty, restarted = None, LoopDetector(), 0, True
            continue
        first = False
        yield item, rt
        if rt is None or not rt.token:
            return
        empty = _checked_next(rt, token, count, empty, loops, max_empty_pages,
                              url_for, params)
        token = rt.token


def _restarting(log: logging.Logger | LoggerLike, exc: BadResumptionToken, token: str,
                first: bool, url: str) -> None:
    whose = "the checkpoint's resumptionToken" if first else "resumptionToken"
    log.warning(
        f"{whose} {token!r} was rejected "
        f"({exc.server_message or 'badResumptionToken'}); "
        f"restarting the list from its original arguments at {url}"
    )


def _checked_next(
    rt: ResumptionToken, token: str | None, count: int, empty: int, loops: LoopDetector,
    max_empty_pages: int, url_for: Callable[[dict[str, str]], str], params: dict[str, str],
) -> int:
    """The count of record-less pages in a row after a page of `count` records that
    carries `rt`; raises on a token loop or too many record-less pages."""
    assert rt.token
    if rt.token == token or loops.repeated(rt.token):
        raise OAIDataError(
            "resumptionToken loop: the server sent a token it already sent",
            url=url_for(params),
            token=rt.token,
        )
    if count:
        return 0
    empty += 1
    if empty > max_empty_pages:
        raise OAIDataError(
            f"{empty} pages in a row with a resumptionToken but no records",
            url=url_for(params),
            token=rt.token,
        )
    return empty


_END = object()


class LoopDetector:
    """Finds a resumptionToken sequence that repeats, in constant memory: the recent
    tokens catch short loops at once, and Brent's method (a saved token compared with
    each new one, saved again at doubling distances) catches a loop of any length
    within two of its turns."""

    RECENT = 64

    def __init__(self) -> None:
        self.recent: dict[str, None] = {}
        self.saved: str | None = None
        self.power = 1
        self.steps = 0

    def repeated(self, token: str) -> bool:
        if token in self.recent or token == self.saved:
            return True
        self.recent[token] = None
        if len(self.recent) > self.RECENT:
            del self.recent[next(iter(self.recent))]
        self.steps += 1
        if self.steps == self.power:
            self.saved, self.power, self.steps = token, self.power * 2, 0
        return False


class _Ahead:
    """One daemon thread that computes ``next(pages)`` each time it is asked, its
    requests belonging to ``scope``. One thread for the whole list, not one per page:
    starting a thread waits until it runs, and under a busy GIL that wait cost about
    2 ms a page on the consumer's thread."""

    def __init__(self, pages: Iterator[Page], scope: CancelScope) -> None:
        self._pages = pages
        self._asked = threading.Semaphore(0)
        self._done = threading.Event()
        self.stopping = Stop()
        self._value: Any = _END
        self._error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(scope,), name="oai-prefetch", daemon=True
        )
        self.thread.start()

    def ask(self) -> None:
        """Start computing the next page (call `result` before asking again)."""
        self._done.clear()
        self._asked.release()

    def stop(self) -> None:
        """Let the thread end once the page it computes (if any) is done."""
        self.stopping.set()
        self._asked.release()

    def _run(self, scope: CancelScope) -> None:
        bind_scope(scope)
        while True:
            self._asked.acquire()
            if self.stopping.is_set():
                return
            try:
                self._value = next(self._pages, _END)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                self._value, self._error = _END, exc
            finally:
                self._done.set()
            if self._value is _END:
                return

    def result(self) -> Any:
        """The page asked for (or `_END`); raises what the fetch raised. A signal
        interrupts the wait."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


_JOIN_AFTER_CANCEL = 5.0


def prefetched(pages: Iterator[Page], parent: CancelScope,
               hold: Callable[[Page], bool] | None = None) -> Iterator[Page]:
    """Fetch the next page in a background thread while the current one is consumed;
    after a page for which `hold(page)` is true, only once the consumer asks for it (a
    consumer that may stop there sends no request it would throw away).

    Leaving early (an error, an interrupt, the consumer stopping) cancels the fetch in
    flight rather than waiting for it; the thread is a daemon, so even a step that
    cannot be cut short (name resolution) never holds up the process's exit."""
    scope = parent.child()
    ahead = _Ahead(pages, scope)
    ahead.ask()
    finished = False
    try:
        while True:
            page = ahead.result()
            if page is _END:
                finished = True
                return
            held = hold is not None and hold(page)
            if not held:
                ahead.ask()
            yield page
            if held:
                ahead.ask()
    finally:
        ahead.stop()
        # At once unless a fetch ignores the cancel.
        ahead.stopping.end([ahead.thread], timeout=_JOIN_AFTER_CANCEL,
                           cancel=None if finished else scope.cancel)
        parent.forget(scope)
        close = getattr(pages, "close", None)
        if close is not None and not ahead.thread.is_alive():
            close()

