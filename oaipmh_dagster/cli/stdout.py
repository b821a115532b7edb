"""stdout as Unix tools treat it.

A reader that goes away (`oaipmh-dagster records ID --json | head`) ends the command
quietly with exit code 141, 128 + SIGPIPE: what the shell reports for `cat` in its place,
so `set -o pipefail` scripts see the same status as for any other tool. A closed stdout
(`>&-`) makes the first write fail with one error line (`cannot write to stdout: it is
closed`), as `cat` fails with `write error: Bad file descriptor`."""

from __future__ import annotations

import errno
import io
import os
import select
import sys
from typing import Any

__all__ = ["READER_GONE", "ClosedStdout", "StdoutClosed", "guard_closed_stdout",
           "quiet_stdout", "reader_gone"]

READER_GONE = 128 + 13  # 128 + SIGPIPE


class StdoutClosed(OSError):
    """A write to a stdout that is closed."""

    def __init__(self) -> None:
        super().__init__(errno.EBADF, "stdout is closed")

    def __str__(self) -> str:
        return "cannot write to stdout: it is closed"


class _ClosedBinary(io.RawIOBase):
    """The binary side of `ClosedStdout`."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if not data:
            return 0
        raise StdoutClosed


class ClosedStdout(io.TextIOBase):
    """`sys.stdout` when file descriptor 1 was closed (Python leaves None there, which
    click writes nothing to): writing anything fails; there is never anything to flush."""

    encoding = "utf-8"  # what click checks before it writes here
    errors = "strict"

    def __init__(self) -> None:
        super().__init__()
        self.buffer = _ClosedBinary()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # not a binary stream, for click's probe
            raise TypeError("write() argument must be str")
        if not text:
            return 0
        raise StdoutClosed


def guard_closed_stdout() -> None:
    """Put a `ClosedStdout` where Python left None for a closed file descriptor 1, and
    hold descriptor 1 with /dev/null opened read-only: else the next file opened (the
    SQLite database, say) would take it and become what stdout writes to."""
    if sys.stdout is not None:
        return
    sys.stdout = ClosedStdout()
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
    except OSError:
        pass


def reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reading end is closed."""
    try:
        poller = select.poll()
        poller.register(sys.__stdout__.fileno(), select.POLLOUT)  # type: ignore[union-attr]
        return any(events & (select.POLLERR | select.POLLHUP)
                   for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def quiet_stdout() -> None:
    """Point file descriptor 1 at /dev/null, so that Python's last flush of what is left
    in stdout's buffer writes nowhere instead of raising BrokenPipeError again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())  # type: ignore[union-attr]
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
