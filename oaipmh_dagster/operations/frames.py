"""A harvester's live records as pandas DataFrames: one row per record, the header's
`oai_identifier`, `datestamp` (a UTC timestamp; NaT for the placeholder of an
unreadable one) and `sets` (a list), then one column per field of the transformed
metadata (its value as stored: a repeated field is a list; None where a record lacks
the field). A field named like a header column becomes `metadata.<name>`; metadata
that is not a dict (a transformer's own shape) is the column `metadata`.

`records_frame` reads them all into one frame; `RecordBatches` reads them lazily, a
frame of at most `batch_size` rows at a time (each frame has the fields its own records
have), so a harvest larger than memory can be walked through. pandas is imported on
first use (a code location that never loads a frame does not pay for it)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from oaipmh_dagster.storage.ports import RecordStore, Selection

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["DEFAULT_BATCH_SIZE", "HEADER_COLUMNS", "RecordBatches", "records_frame",
           "records_frames"]

HEADER_COLUMNS = ("oai_identifier", "datestamp", "sets")
DEFAULT_BATCH_SIZE = 10_000
# Rows per query of a whole frame (the store's keyset read).
_READ = 5_000
_LIVE = Selection(deleted=False)
_DATESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def records_frame(store: RecordStore, harvester_id: str,
                  columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Every live record of `harvester_id` in one DataFrame, by identifier (`columns`:
    keep only these, `oai_identifier` always)."""
    return _frame(store.iter_records(harvester_id, _LIVE, batch=_READ), columns)


def records_frames(store: RecordStore, harvester_id: str,
                   batch_size: int = DEFAULT_BATCH_SIZE,
                   columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
    """The live records of `harvester_id` as DataFrames of at most `batch_size` rows, by
    identifier; one batch is in memory at a time (none when there is no live record)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive number of rows, not {batch_size}")
    batch: list[dict[str, Any]] = []
    for item in store.iter_records(harvester_id, _LIVE, batch=min(batch_size, _READ)):
        batch.append(item)
        if len(batch) >= batch_size:
            yield _frame(batch, columns)
            batch = []
    if batch:
        yield _frame(batch, columns)


@dataclass(frozen=True)
class RecordBatches:
    """A harvester's live records, read lazily as DataFrames of at most `batch_size`
    rows (see `records_frames`). Iterate over it (once or more: each iteration reads
    the store afresh); nothing is read before."""

    store: RecordStore
    harvester_id: str
    batch_size: int = DEFAULT_BATCH_SIZE
    columns: tuple[str, ...] | None = None

    def __iter__(self) -> Iterator[pd.DataFrame]:
        return records_frames(self.store, self.harvester_id, self.batch_size, self.columns)

    def count(self) -> int:
        """How many live records there are (one COUNT)."""
        return self.store.count(self.harvester_id)


def _frame(items: Iterator[dict[str, Any]] | list[dict[str, Any]],
           columns: Sequence[str] | None) -> pd.DataFrame:
    """The DataFrame of stored records (`iter_records` items)."""
    import pandas as pd

    ids: list[str] = []
    dates: list[str] = []
    sets: list[list[str]] = []
    metas: list[Any] = []
    for item in items:
        ids.append(item["oai_identifier"])
        dates.append(item["datestamp"])
        sets.append(item["sets"])
        metas.append(item["metadata"])
    data: dict[str, Any] = {
        "oai_identifier": ids,
        "datestamp": pd.to_datetime(dates, format=_DATESTAMP_FORMAT, utc=True,
                                    errors="coerce"),
        "sets": sets,
    }
    keep = None if columns is None else {"oai_identifier", *columns}
    fields: dict[str, None] = {}
    other = False
    for meta in metas:
        if isinstance(meta, dict):
            fields.update(dict.fromkeys(meta))
        elif meta is not None:
            other = True
    for name in fields:
        column = f"metadata.{name}" if name in HEADER_COLUMNS else name
        if keep is None or column in keep:
            data[column] = [m.get(name) if isinstance(m, dict) else None for m in metas]
    if other and "metadata" not in data and (keep is None or "metadata" in keep):
        data["metadata"] = [None if isinstance(m, dict) else m for m in metas]
    del metas, dates  # the record dicts go before the frame's arrays are built
    if keep is not None:
        data = {name: values for name, values in data.items() if name in keep}
    return pd.DataFrame(data)
