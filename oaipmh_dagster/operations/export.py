"""Export a harvester's records to Parquet (pyarrow, batch by batch), CSV (pandas),
JSON Lines or one XML document of the records as harvested (`export_xml`)."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from oaipmh_dagster.errors import OAIPMHDagsterError
from oaipmh_dagster.operations.export_xml import write_xml
from oaipmh_dagster.operations.flat import flatten
from oaipmh_dagster.storage.ports import DATESTAMP_PLACEHOLDER, RecordStore

FORMATS = ("parquet", "csv", "jsonl", "xml")
STDOUT = "-"
BATCH = 10_000
BUFFER = 1 << 20


def _batches(store: RecordStore, harvester_id: str) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for item in store.iter_records(harvester_id):
        batch.append(item)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


class ExportError(OAIPMHDagsterError):
    """The export could not be written (a regular file at the destination is untouched)."""


class BadDestination(ExportError):
    """The destination cannot take an export (bad input: nothing was read or written)."""


@dataclass(frozen=True)
class Destination:
    """Where an export goes: stdout, a device or pipe written in place, or a regular file
    (existing or not) replaced atomically. A symlink is followed: its target is written.
    A path that opens the file stdout is (`/dev/stdout`, `/dev/fd/1`) is stdout."""

    shown: str
    path: Path | None  # None: stdout
    in_place: bool = False

    @classmethod
    def resolve(cls, output: str | os.PathLike[str], fmt: str) -> Destination:
        """Check `output` before anything is read; raise `BadDestination` or `ExportError`."""
        shown = os.fspath(output)
        if not shown:
            raise BadDestination("the output path is empty (use '-' for stdout)")
        if shown == STDOUT or _is_stdout(shown):
            if fmt == "parquet" and _isatty(sys.stdout):
                raise BadDestination("will not write binary parquet to a terminal: "
                                     "redirect stdout or give --output PATH")
            return cls(shown, None)
        return cls._file(shown)

    @classmethod
    def _file(cls, shown: str) -> Destination:
        """A path: followed through symlinks, checked for what can be written there."""
        try:  # the kernel follows /dev/fd/N to a pipe; realpath would not
            mode: int | None = os.stat(shown).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise ExportError(f"cannot write {shown}: {exc.strerror}") from exc
        if mode is not None and stat.S_ISDIR(mode):
            raise BadDestination(f"{shown} is a directory")
        if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)
                                 or stat.S_ISBLK(mode) or stat.S_ISSOCK(mode)):
            return cls(shown, Path(shown), in_place=True)
        path = Path(os.path.realpath(shown))
        if mode is not None and not stat.S_ISREG(mode):
            raise BadDestination(f"{shown} is neither a regular file, a device nor a pipe")
        if not path.parent.is_dir():
            raise BadDestination(f"directory {path.parent} does not exist")
        if not os.access(path.parent, os.W_OK | os.X_OK) or (
                mode is not None and not os.access(path, os.W_OK)):
            raise ExportError(f"cannot write {shown}: "
                              f"{os.strerror(_access_errno(path.parent))}")
        return cls(shown, path)

    @contextmanager
    def open(self) -> Iterator[BinaryIO]:
        """A binary file to write; a regular file appears at the path only on success."""
        if self.path is None:
            sys.stdout.flush()
            yield sys.stdout.buffer
            sys.stdout.buffer.flush()
        elif self.in_place:
            with self.path.open("wb") as fh:
                yield fh
        else:
            with _atomic(self.path) as fh:
                yield fh


def _is_stdout(path: str) -> bool:
    """Whether `path` names stdout (`/dev/stdout`, `/dev/fd/1`, even when it is closed)
    or opens the very file stdout is."""
    if os.path.normpath(path) in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1",
                                  f"/proc/{os.getpid()}/fd/1"):
        return True
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (AttributeError, OSError, ValueError):  # no stdout, or not a real file
        return False


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _access_errno(directory: Path) -> int:
    """EROFS for a read-only file system, else EACCES."""
    try:
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return errno.EROFS
    except OSError:
        pass
    return errno.EACCES


@contextmanager
def _atomic(path: Path) -> Iterator[BinaryIO]:
    """Write a temporary file next to `path` and rename it over `path` on success.

    The result keeps the mode of the file it replaces (a new file gets the umask's)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb", buffering=BUFFER) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode_for(path))
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _write_jsonl(items: Iterable[dict[str, Any]], fh: BinaryIO) -> int:
    n = 0
    for item in items:
        fh.write((json.dumps(item, ensure_ascii=False) + "\n").encode("utf-8"))
        n += 1
    return n


def _write_csv(store: RecordStore, harvester_id: str, fh: BinaryIO) -> int:
    import pandas as pd

    frames = [pd.DataFrame([flatten(i) for i in b]) for b in _batches(store, harvester_id)]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["oai_identifier", "datestamp", "deleted", "sets", "errors"])
    frame = _csv_booleans(frame)
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="", write_through=True)
    try:
        frame.to_csv(text, index=False)
        text.flush()
    finally:
        text.detach()
    return len(frame)


def _csv_booleans(frame: Any) -> Any:
    """Flags as `true`/`false` (pandas writes Python's `True`/`False`); numbers stay."""
    for column in frame.columns:
        if frame[column].dtype == bool or frame[column].dtype == object:
            frame[column] = frame[column].map(
                lambda v: ("true" if v else "false") if isinstance(v, bool) else v)
    return frame


def parquet_schema() -> Any:
    """The Parquet columns: datestamps as UTC timestamps (an unreadable datestamp, stored
    as the placeholder, is null), sets a list of strings, metadata and errors JSON text."""
    import pyarrow as pa

    stamp = pa.timestamp("ms", tz="UTC")
    return pa.schema([
        ("oai_identifier", pa.string()), ("datestamp", stamp), ("deleted", pa.bool_()),
        ("sets", pa.list_(pa.string())), ("metadata", pa.string()), ("errors", pa.string()),
        ("harvested_at", stamp), ("run_id", pa.string()),
    ])


def _stamp(text: str | None) -> datetime | None:
    """A stored datestamp (`...Z`, UTC) as a datetime; the placeholder is None."""
    if not text or text == DATESTAMP_PLACEHOLDER:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _write_parquet(store: RecordStore, harvester_id: str, fh: BinaryIO) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema()
    n = 0
    with pq.ParquetWriter(fh, schema) as writer:
        for b in _batches(store, harvester_id):
            columns = {
                "oai_identifier": [i["oai_identifier"] for i in b],
                "datestamp": [_stamp(i["datestamp"]) for i in b],
                "deleted": [i["deleted"] for i in b],
                "sets": [i["sets"] for i in b],
                "metadata": [None if i["metadata"] is None
                             else json.dumps(i["metadata"], ensure_ascii=False) for i in b],
                "errors": [json.dumps(i["errors"], ensure_ascii=False) for i in b],
                "harvested_at": [_stamp(i["harvested_at"]) for i in b],
                "run_id": [i["run_id"] for i in b],
            }
            writer.write_table(pa.Table.from_pydict(columns, schema=schema))
            n += len(b)
    return n


def export(store: RecordStore, harvester_id: str, fmt: str, output: str | os.PathLike[str]) -> int:
    """Write every record of a harvester to `output` ('-' is stdout); returns the count.

    A regular file is written to a temporary file and renamed on success, so a failure
    leaves the old file (or none); a device or named pipe is written in place; a symlink's
    target is written. Raises `BadDestination` for an unusable `output` (before reading
    anything) and `ExportError` when writing fails."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    destination = Destination.resolve(output, fmt)
    try:
        with destination.open() as fh:
            if fmt == "jsonl":
                return _write_jsonl(store.iter_records(harvester_id), fh)
            if fmt == "csv":
                return _write_csv(store, harvester_id, fh)
            if fmt == "xml":
                return write_xml(store.iter_records(harvester_id, with_raw=True), fh,
                                 harvester_id)
            return _write_parquet(store, harvester_id, fh)
    except BrokenPipeError:
        if destination.path is None:
            raise  # stdout's reader went away (`| head`): the caller ends quietly
        raise ExportError(f"cannot write {destination.shown}: the reader went away") from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ExportError(f"cannot write {destination.shown}: {reason}") from exc
