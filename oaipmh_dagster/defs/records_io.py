"""The IO manager of every harvester's `oaipmh/<id>/records`: an asset that takes it as
an input receives that harvester's live records from the record store, read when the
downstream step runs (materializing the downstream asset alone harvests nothing).

- Annotated `pd.DataFrame` (or not at all): one DataFrame of every live record
  (`operations.frames`: `oai_identifier`, `datestamp`, `sets`, then the metadata's
  fields, repeated ones as lists).
- Annotated `RecordBatches`, or with `batch_size` in the input's metadata
  (`dg.AssetIn(key, metadata={"batch_size": 50_000})`): a lazy iterable of DataFrames of
  at most that many rows (10,000 without `batch_size`), for harvests too large for memory.
- `columns` in the input's metadata keeps only those columns (and `oai_identifier`).

The op stores the records itself, so `handle_output` stores nothing. A harvester the
registry does not hold fails the step with one line; nothing is written.

Dagster refuses to load definitions in which an asset takes an input that no asset
produces: where a harvester may be missing (a sharded workspace serves each harvester
from one code location; a harvester removed), add its downstream assets only when
`serves_records(defs, harvester_id)`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from oaipmh_dagster.contracts import RECORDS, asset_paths, harvester_of
from oaipmh_dagster.operations.frames import DEFAULT_BATCH_SIZE, RecordBatches, records_frame
from oaipmh_dagster.storage.registry import HarvesterNotFound, Registry

__all__ = ["BATCH_SIZE_KEY", "COLUMNS_KEY", "RECORDS_IO_MANAGER_KEY", "RecordBatches",
           "RecordsIOManager", "input_options", "records_io_manager", "records_key",
           "serves_records"]

RECORDS_IO_MANAGER_KEY = "oaipmh_records_io_manager"
# Keys of a downstream input's metadata (`dg.AssetIn(..., metadata={...})`).
BATCH_SIZE_KEY = "batch_size"
COLUMNS_KEY = "columns"


def records_key(harvester_id: str) -> dg.AssetKey:
    """The key of a harvester's records asset (`oaipmh/<id>/records`)."""
    return dg.AssetKey(asset_paths(harvester_id)[2])


def serves_records(defs: dg.Definitions, harvester_id: str) -> bool:
    """Whether `defs` (what `load_definitions()` returned) holds the harvester's records
    asset, so an asset downstream of it can be merged in."""
    key = records_key(harvester_id)
    return any(key in getattr(a, "keys", ()) for a in defs.assets or ())


class RecordsIOManager(dg.IOManager):
    """Loads a harvester's live records from the store (see the module's docstring)."""

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        """Nothing to store: the harvest op wrote the records to the store."""

    def load_input(self, context: dg.InputContext) -> Any:
        key = context.asset_key if context.has_asset_key else None
        harvester_id = harvester_of(key.path, RECORDS) if key is not None else None
        if key is None or harvester_id is None:
            shown = key.to_user_string() if key is not None else f"input {context.name!r}"
            raise dg.Failure(f"{RECORDS_IO_MANAGER_KEY} loads the records assets "
                             f"oaipmh/<harvester id>/records only, not {shown}")
        oaipmh_db = context.resources.oaipmh_db
        try:
            Registry(oaipmh_db.engine()).get(harvester_id)
        except HarvesterNotFound:
            raise dg.Failure(f"no harvester {harvester_id!r} in the registry: there are no "
                             f"records of {key.to_user_string()} to load") from None
        batch_size, columns = input_options(context.definition_metadata or {})
        store = oaipmh_db.record_store()
        if batch_size is not None or _wants_batches(context.dagster_type):
            if _wants_frame(context.dagster_type):
                raise dg.Failure(f"input {context.name!r} has a {BATCH_SIZE_KEY}: annotate "
                                 "it RecordBatches (an iterable of DataFrames), not DataFrame")
            batches = RecordBatches(store, harvester_id, batch_size or DEFAULT_BATCH_SIZE,
                                    columns)
            context.log.info(f"{key.to_user_string()}: live records in batches of "
                             f"{batches.batch_size:,} rows")
            return batches
        frame = records_frame(store, harvester_id, columns)
        context.log.info(f"{key.to_user_string()}: {len(frame):,} live records, "
                         f"{frame.shape[1]} columns")
        return frame


def input_options(metadata: Mapping[str, Any]) -> tuple[int | None, tuple[str, ...] | None]:
    """(`batch_size`, `columns`) of a downstream input's metadata; a bad value fails."""
    batch_size = metadata.get(BATCH_SIZE_KEY)
    batch_size = getattr(batch_size, "value", batch_size)  # a MetadataValue: its value
    if batch_size is not None and (isinstance(batch_size, bool)
                                   or not isinstance(batch_size, int) or batch_size < 1):
        raise dg.Failure(f"{BATCH_SIZE_KEY} must be a positive number of rows, "
                         f"not {batch_size!r}")
    columns = metadata.get(COLUMNS_KEY)
    columns = getattr(columns, "value", columns)
    if columns is not None and (not isinstance(columns, list | tuple) or not all(
            isinstance(c, str) for c in columns)):
        raise dg.Failure(f"{COLUMNS_KEY} must be a list of column names, not {columns!r}")
    return batch_size, (tuple(columns) if columns is not None else None)


def _typing_type(dagster_type: dg.DagsterType | None) -> Any:
    return getattr(dagster_type, "typing_type", None)


def _wants_batches(dagster_type: dg.DagsterType | None) -> bool:
    typ = _typing_type(dagster_type)
    return isinstance(typ, type) and issubclass(typ, RecordBatches)


def _wants_frame(dagster_type: dg.DagsterType | None) -> bool:
    typ = _typing_type(dagster_type)
    return isinstance(typ, type) and typ.__module__.startswith("pandas") \
        and typ.__name__ == "DataFrame"


@dg.io_manager(required_resource_keys={"oaipmh_db"},
               description="Loads a harvester's live records from the record store as "
               "pandas DataFrames (the harvest op stores them; nothing is stored here).")
def records_io_manager(_: dg.InitResourceContext) -> RecordsIOManager:
    """The IO manager of the records assets, under `RECORDS_IO_MANAGER_KEY`."""
    return RecordsIOManager()
