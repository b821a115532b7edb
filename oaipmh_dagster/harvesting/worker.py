"""The rest of a long sequential harvest in a worker process: fetch, parse, hash look-up,
transform and rows there, the writes here.

A harvest runs in one process until a list shows it is long (`Split.due`); then a worker
(`python -m oaipmh_dagster.harvesting.worker`) continues the lists from that page's
checkpoint with its own client and its own read-only connection to the store, and sends
each prepared page (`lists.ReadyPage`), its log lines and, at the end, the lists it
judged and its client's counts. The harvest's process keeps everything else: the lease,
each page's fenced commit with its checkpoint (in order), statistics and progress. One
writer, and the page loop on a second core.

Messages are pickled over the worker's stdout; its stdin stays open while the harvest
lives, so a worker whose harvest died (even killed) sees end-of-file there and exits.
A worker that dies fails the harvest after the pages it sent are committed; its error
is raised here as it was raised there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.harvesting.delivered import Delivered
from oaipmh_dagster.harvesting.lists import Judged, Lists, ListTally, Position, ReadyPage
from oaipmh_dagster.harvesting.plan import Plan
from oaipmh_dagster.harvesting.rows import prepare_page
from oaipmh_dagster.oai import ClientOptions
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["WORKER_ENV", "Split", "Worker", "WorkerDied", "split_setting"]

WORKER_ENV = "OAIPMH_HARVEST_WORKER"
DEFAULT_RECORDS = 20_000
PIPE_BYTES = 1 << 20  # the pipe's buffer: the worker runs a few pages ahead of the writer
STOP_WAIT = 10.0  # seconds a worker gets to exit once its harvest stops


class WorkerDied(OAIPMHDagsterError, RuntimeError):
    """The worker process ended without finishing its lists (killed, out of memory)."""


def split_setting(environ: dict[str, str] | os._Environ[str] | None = None) -> int | None:
    """From how many records still to come a harvest moves its lists to a worker process
    (`$OAIPMH_HARVEST_WORKER`: a number, default 20,000; `off`: never)."""
    raw = (environ if environ is not None else os.environ).get(WORKER_ENV, "").strip()
    if not raw:
        return DEFAULT_RECORDS
    if raw.lower() in ("off", "no", "false", "0"):
        return None
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = -1
    if value < 1:
        raise ValueError(f"${WORKER_ENV} must be a number of records (at least 1) or "
                         f"'off', not {raw!r}")
    return value


@dataclass(frozen=True)
class Spec:
    """What a worker needs to continue a harvest."""

    h: Harvester
    plan: Plan
    position: Position
    options: ClientOptions
    store_url: str = field(repr=False)  # may hold a password
    run_id: str = ""
    identifiers: bool = False  # send every page's identifiers (a selection sweep needs them)
    # what the harvest delivered into a store that held none of its records (else None)
    delivered: tuple[str, ...] | None = field(default=None, repr=False)
    debug: bool = False


@dataclass(frozen=True)
class End:
    """What a worker sends last: the lists it judged, its client's counts."""

    judged: Judged
    client: dict[str, int]


@dataclass(frozen=True)
class Split:
    """When a harvest hands its lists over: after a page with a token, once the list
    announces at least `records` still to come, or (size unknown) this process has
    delivered that many; `url` opens the store in the worker."""

    records: int
    url: str = field(repr=False)

    def due(self, tally: ListTally, delivered: int) -> bool:
        """After a page: the open list's tally, the records this process delivered."""
        remaining = tally.remaining
        return (remaining if remaining is not None else delivered) >= self.records


class Worker:
    """One worker process continuing a harvest from `spec.position`; `pages()` yields
    what it sends, in order."""

    def __init__(self, spec: Spec, logger: Any) -> None:
        self.logger = logger
        self.end: End | None = None
        self._proc = subprocess.Popen(  # noqa: S603 - this interpreter, this module
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            bufsize=1 << 16)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._out = self._proc.stdout
        try:
            pickle.dump(list(sys.path), self._proc.stdin)  # a custom transformer's modules
            pickle.dump(spec, self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.flush()
        except OSError:
            pass  # it died at once: `pages` says how

    def pages(self) -> Iterator[ReadyPage]:
        """Each page the worker prepared; its log lines go to the harvest's logger; raises
        the worker's error, or `WorkerDied` when it ended without a word."""
        while True:
            try:
                kind, body = pickle.load(self._out)
            except (EOFError, OSError, pickle.UnpicklingError):
                code = self._proc.wait()
                raise WorkerDied(f"the harvest's worker process ended before its lists did "
                                 f"(exit code {code}); the pages committed stay, the next "
                                 "harvest resumes after them") from None
            if kind == "page":
                yield body
            elif kind == "log":
                getattr(self.logger, body[0])(body[1])
            elif kind == "end":
                self.end = body
                return
            else:  # "error": (the exception, its traceback, the counts so far)
                self.end = End(Judged(), body[2])
                self.logger.debug("the worker's traceback:\n%s", body[1])
                raise body[0]

    def close(self) -> None:
        """Stop the worker (at once unless it already ended) and wait for it."""
        proc = self._proc
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        if proc.poll() is None:
            try:
                proc.wait(timeout=0 if self.end is None else STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._out.close()


# -- in the worker process ------------------------------------------------------------


class _Forward:
    """A logger that sends its lines to the harvest's process."""

    def __init__(self, send: Any, debug: bool) -> None:
        self._send, self._debug = send, debug

    def _line(self, level: str, msg: str, *args: Any, **_: Any) -> None:
        self._send("log", (level, msg % args if args else msg))

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        if self._debug:
            self._line("debug", msg, *args)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._line("info", msg, *args)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._line("warning", msg, *args)

    def error(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._line("error", msg, *args)


def _sendable(exc: BaseException) -> BaseException:
    """`exc` when it survives pickling, else a `RuntimeError` that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _watch(fd: int) -> None:
    """Exit when the harvest's end of stdin closes (it stopped, or died). The file
    descriptor, not `sys.stdin`: a buffered reader's lock held at exit aborts it."""
    with contextlib.suppress(OSError):
        while os.read(fd, 1 << 12):
            pass
    os._exit(3)


def _run(spec: Spec, send: Any) -> None:
    from oaipmh_dagster.harvesting.harvest import make_transform, make_validate
    from oaipmh_dagster.oai import OAIClient
    from oaipmh_dagster.storage import db
    from oaipmh_dagster.storage.store import Store

    h, plan = spec.h, spec.plan
    logger = _Forward(send, spec.debug)
    judged = Judged()
    client = OAIClient(h.base_url, spec.options, logger=logger)
    try:
        store = Store(db.get_engine(spec.store_url, migrate=False))
        transform, validate = make_transform(h.transformer), make_validate(h)
        lists = Lists(client, h, plan, judged, logger, start=spec.position)
        delivered = Delivered(spec.delivered) if spec.delivered is not None else None
        for page, cp in lists.pages():
            prepared = prepare_page(store, h.id, page.records, run_id=spec.run_id,
                                    transform=transform, metadata_prefix=h.metadata_prefix,
                                    transformer=h.transformer, validate=validate,
                                    delivered=delivered)
            ids = [r.header.identifier for r in page.records] if spec.identifiers else None
            send("page", ReadyPage.of(page, prepared, None if cp is None else cp.to_json(),
                                      ids))
    except BaseException as exc:
        send("error", (_sendable(exc), traceback.format_exc(), _counts(client)))
        raise
    finally:
        client.close()
    send("end", End(judged, _counts(client)))


def _counts(client: Any) -> dict[str, int]:
    s = client.stats
    return {"requests": s.requests, "retries": s.retries, "bytes_received": s.bytes_received,
            "pages": s.pages, "stripped_chars": s.stripped_chars,
            "skipped_headers": s.skipped_headers}


def main() -> int:
    """The worker: read its spec from stdin, send its messages to stdout."""
    stdin = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    with contextlib.suppress(OSError, AttributeError):  # Linux: a few pages, not 64 KB
        fcntl.fcntl(out.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    os.dup2(2, 1)  # a stray print goes to stderr, never into the messages
    sys.path[:] = pickle.load(stdin)
    spec: Spec = pickle.load(stdin)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the harvest's to handle
    threading.Thread(target=_watch, args=(stdin.fileno(),), name="oaipmh-worker-watch",
                     daemon=True).start()
    logging.basicConfig(level=logging.WARNING)
    lock = threading.Lock()

    def send(kind: str, body: Any) -> None:
        data = pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL)
        with lock:
            out.write(data)
            out.flush()

    try:
        _run(spec, send)
    except BrokenPipeError:
        return 3  # the harvest is gone
    except BaseException:  # noqa: BLE001 - sent to the harvest already
        return 1
    return 0


if __name__ == "__main__":
    # The module by its own name, so that what it pickles unpickles in the harvest.
    from oaipmh_dagster.harvesting import worker

    sys.exit(worker.main())
