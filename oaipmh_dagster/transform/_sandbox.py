"""Records through a stylesheet in a child process, within a time, output and memory
budget.

libxslt cannot be interrupted in-process: a stylesheet that never ends would hold its
thread, and the signals and cancels aimed at it, for ever. Here each batch of records
goes to a worker process (:mod:`._xslt_worker`) that answers them in order; the parent
waits in short slices (so SIGINT, SIGTERM and Dagster's cancel are handled within
them), kills the worker when a record runs over its time budget, records that
record's failure and goes on with the next one in a fresh worker. The worker's address
space is capped (the memory ceiling) and it refuses results over the output budget.

Idle workers are kept in a small pool for the next batch of any thread; each exits
when its pipe closes or, stuck in a stylesheet, within a second of its parent's end.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import _xslt_worker as wire
from ._util import TransformError

SLICE = 0.1  # the longest wait before signals and deadlines are looked at again
STARTUP = 60.0  # seconds a new worker may take to start and compile a stylesheet
MAX_IDLE = 4  # idle workers kept for later batches
_READ = 1 << 20
_WRITE = 1 << 16
_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
_HERE = Path(__file__).resolve().parent

Outcome = bytes | TransformError  # the result's root element, serialized


@dataclass(frozen=True)
class Limits:
    """Per-record budgets: seconds of work, bytes of output, bytes of address space."""

    seconds: float = 5.0
    max_output: int = 10 * 2**20
    max_memory: int = 2**30


@dataclass(frozen=True)
class Job:
    """A stylesheet as a worker runs it: `key` names this exact content, parameters
    and output budget (the worker keeps it compiled under that key)."""

    name: str  # the transformer's spec: the location of its records' errors
    key: str
    path: str
    source: bytes
    files: tuple[str, ...]
    params: dict[str, str]
    limits: Limits

    def frame(self) -> bytes:
        head = json.dumps({"key": self.key, "path": self.path, "files": list(self.files),
                           "params": self.params, "max_output": self.limits.max_output,
                           "max_memory": self.limits.max_memory}).encode()
        return _frame(b"S", head + b"\n" + self.source)


def _frame(kind: bytes, payload: bytes) -> bytes:
    return wire.HEADER.pack(kind, len(payload)) + payload


class _Worker:
    """One worker process and the stylesheet it has selected."""

    def __init__(self) -> None:
        if not sys.executable:
            raise TransformError("transform_failed", "no Python interpreter to run "
                                 "stylesheets in (sys.executable is empty)")
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _BOOT, str(_HERE / "_xslt_worker.py")],
            # stderr: what a stylesheet makes libxml2 say is not the harvest's to log.
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.wfd = self.proc.stdin.fileno()
        self.rfd = self.proc.stdout.fileno()
        os.set_blocking(self.wfd, False)
        self.selected: str | None = None

    def peak_memory(self) -> int:
        """The most address space the process has had, in bytes (0 where unknown)."""
        return wire.peak_memory(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def status(self) -> str:
        """How the process ended (waited for briefly)."""
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"

    def kill(self) -> None:
        """End the process now and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self._reap(5)

    def close(self) -> None:
        """Let the process end by closing its input (killed if it does not)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        self._reap(1)

    def _reap(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)  # a SIGKILLed process ends at once
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _acquire() -> _Worker:
    with _idle_lock:
        while _idle:
            worker = _idle.pop()
            if worker.alive():
                return worker
            worker.kill()
    return _Worker()


def _release(worker: _Worker) -> None:
    if worker.alive():
        with _idle_lock:
            if len(_idle) < MAX_IDLE:
                _idle.append(worker)
                return
    worker.close()


@atexit.register
def close_idle() -> None:
    """End the idle workers (at exit; also for tests)."""
    with _idle_lock:
        workers = list(_idle)
        _idle.clear()
    for worker in workers:
        worker.close()


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


class _Batch:
    """One batch of records through one job, across as many workers as it takes."""

    def __init__(self, job: Job, records: Sequence[bytes]) -> None:
        self.job = job
        self.records = records
        self.results: list[Outcome] = []
        self.worker: _Worker | None = None

    def run(self) -> list[Outcome]:
        try:
            while len(self.results) < len(self.records):
                self._session()
        except BaseException:
            if self.worker is not None:
                self.worker.kill()
                self.worker = None
            raise
        if self.worker is not None:
            _release(self.worker)
        return self.results

    def _fail(self, message: str, *, kind: str = "transform_failed") -> None:
        self.results.append(TransformError(kind, message, self.job.name))

    def _fail_rest(self, message: str, *, kind: str = "transform_failed") -> None:
        while len(self.results) < len(self.records):
            self._fail(message, kind=kind)

    def _session(self) -> None:
        """Send the records not yet answered to a worker and take its answers until
        they are all in, the worker dies or a record runs over its time."""
        worker = self.worker = self.worker or _acquire()
        session = _Session(self, worker)
        ended = session.run()
        if ended:
            worker.kill()
            self.worker = None


class _Session:
    """What one worker is sent and has answered in one batch."""

    def __init__(self, batch: _Batch, worker: _Worker) -> None:
        self.batch = batch
        self.worker = worker
        self.base = len(batch.results)
        job = batch.job
        self.ready = worker.selected == job.key
        frames = [] if self.ready else [job.frame()]
        self.ends: list[int] = []
        offset = len(frames[0]) if frames else 0
        for record in batch.records[self.base:]:
            frames.append(_frame(b"R", record))
            offset += len(frames[-1])
            self.ends.append(offset)
        self.out = memoryview(b"".join(frames))
        self.written = 0
        self.inbuf = bytearray()
        self.started = time.monotonic()
        self.clock: float | None = None  # when the record being answered started
        self.frame_limit = 16 * job.limits.max_output + 2**20

    def run(self) -> bool:
        """Until the batch is answered (False) or the worker must go (True)."""
        poller = select.poll()
        poller.register(self.worker.rfd, select.POLLIN)
        writing = self.written < len(self.out)
        if writing:
            poller.register(self.worker.wfd, select.POLLOUT)
        while len(self.batch.results) < len(self.batch.records):
            self._start_clock()
            for fd, _ in poller.poll(self._timeout() * 1000):
                if fd == self.worker.wfd and not self._write():
                    poller.unregister(self.worker.wfd)
                elif fd == self.worker.rfd and self._read():
                    return True
            if self._overdue():
                return True
        return False

    def _start_clock(self) -> None:
        index = len(self.batch.results) - self.base
        if (self.clock is None and self.ready and index < len(self.ends)
                and self.written >= self.ends[index]):
            self.clock = time.monotonic()

    def _timeout(self) -> float:
        now = time.monotonic()
        if self.clock is not None:
            left = self.clock + self.batch.job.limits.seconds - now
        elif not self.ready:
            left = self.started + STARTUP - now
        else:
            left = SLICE
        return max(0.0, min(SLICE, left))

    def _write(self) -> bool:
        """Write what the pipe takes; False once all is written (or the worker died:
        its end of the pipe is read as an end of file)."""
        try:
            self.written += os.write(self.worker.wfd,
                                     self.out[self.written:self.written + _WRITE])
        except BlockingIOError:
            return True
        except (BrokenPipeError, OSError):
            self.written = len(self.out)
        return self.written < len(self.out)

    def _read(self) -> bool:
        """Take the answers that arrived; True when the worker is gone."""
        data = os.read(self.worker.rfd, _READ)
        if not data:
            self._died()
            return True
        self.inbuf += data
        at, buf = 0, self.inbuf
        try:
            while len(buf) - at >= wire.HEADER.size:
                kind, size = wire.HEADER.unpack_from(buf, at)
                if size > self.frame_limit:
                    self.batch._fail(f"the stylesheet's worker sent {size:,} bytes for one "
                                     "record: refused")
                    return True
                end = at + wire.HEADER.size + size
                if len(buf) < end:
                    break
                payload, at = bytes(buf[at + wire.HEADER.size:end]), end
                if self._answer(kind, payload):
                    return True
            return False
        finally:
            del buf[:at]

    def _answer(self, kind: bytes, payload: bytes) -> bool:
        """One answer; True when the worker is to be ended."""
        batch = self.batch
        if kind == b"L":
            self.ready = True
            self.worker.selected = batch.job.key
            return False
        if kind == b"O":
            batch.results.append(payload)
        else:
            error = json.loads(payload)
            if not self.ready:  # the stylesheet did not compile in the worker
                batch._fail_rest(error["message"], kind=error["type"])
                return True  # its answers to the records are not read
            batch._fail(error["message"], kind=error["type"])
        self.clock = None
        return kind == b"X"

    def _died(self) -> None:
        status = self.worker.status()
        limits = self.batch.job.limits
        if not self.ready:
            self.batch._fail_rest(f"the stylesheet's worker process did not start ({status})")
        else:
            self.batch._fail(f"the stylesheet's worker process ended ({status}) while "
                             "transforming this record; it may have run over the memory "
                             f"ceiling of {_mib(limits.max_memory)} (xslt.max-memory)")

    def _overdue(self) -> bool:
        now = time.monotonic()
        limits = self.batch.job.limits
        if self.clock is not None and now >= self.clock + limits.seconds:
            memory = ""
            if self.worker.peak_memory() >= 0.8 * limits.max_memory:
                memory = (f" after reaching the memory ceiling of {_mib(limits.max_memory)} "
                          "(xslt.max-memory)")
            self.batch._fail(f"XSLT ran over its time budget of {limits.seconds:g} s "
                             f"(xslt.timeout){memory} and was stopped")
            return True
        if not self.ready and now >= self.started + STARTUP:
            self.batch._fail_rest(f"the stylesheet's worker process did not start within "
                                  f"{STARTUP:g} s")
            return True
        return False


def run(job: Job, records: Sequence[bytes]) -> list[Outcome]:
    """Each record's result (its root element in UTF-8), or its
    :class:`TransformError`, in order."""
    if not records:
        return []
    return _Batch(job, records).run()
