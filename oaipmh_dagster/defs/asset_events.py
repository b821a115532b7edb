"""The newest events of many assets and the newest run of many harvesters, in a few
queries instead of one or two per key.

`harvester list`, the since sensor's tick and since resolution read every harvester's
newest since observation, its newest materializations and its newest run: read one key
at a time through the public calls, that is four statements per harvester (83 s for
`harvester list` of 10,000 harvesters on SQLite, benchmarks case 13). Each function
here answers, for every key, exactly what the public per-key call answers: the batched
reads (`_private`, one ranked query per 2,000 keys) serve two keys or more, and the public
calls serve a single key, a wiped asset, a storage that is not Dagster's SQL one, and a
record the batched read could not give."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from oaipmh_dagster.defs import _private

__all__ = ["BATCH_FROM", "newest_events", "newest_runs", "run_records"]

# Fewer keys than this: the public per-key calls (a single key costs no more that way).
BATCH_FROM = 2
_RUN_IDS_PER_QUERY = 2000  # each statement on PostgreSQL opens a connection


def _fetch(instance: dg.DagsterInstance, event_type: dg.DagsterEventType, key: dg.AssetKey,
           limit: int, after: int) -> list[dg.EventLogRecord]:
    """The public read of one key: its `limit` newest events after storage id `after`."""
    records_filter = dg.AssetRecordsFilter(asset_key=key, after_storage_id=after or None)
    fetch = (instance.fetch_observations if event_type == dg.DagsterEventType.ASSET_OBSERVATION
             else instance.fetch_materializations)
    return list(fetch(records_filter, limit=limit).records)


def newest_events(instance: dg.DagsterInstance, event_type: dg.DagsterEventType,
                  keys: Sequence[dg.AssetKey], limit: int,
                  after: Mapping[dg.AssetKey, int] | None = None,
                  ) -> dict[dg.AssetKey, list[dg.EventLogRecord]]:
    """For each key, its `limit` newest events of `event_type` (an observation or a
    materialization) with a storage id above `after[key]`, newest first: what
    `fetch_observations` / `fetch_materializations(AssetRecordsFilter(asset_key=key,
    after_storage_id=...), limit)` return. The newest `limit` ids are ranked first and
    only those above `after` are read (they are the newest ones), so a key with nothing
    new costs no record."""
    after = after or {}
    keys = list(dict.fromkeys(keys))
    ids = (_private.newest_asset_event_ids(instance, event_type, keys, limit)
           if len(keys) >= BATCH_FROM else None) or {}
    wanted = {key: [i for i in ids[key] if i > (after.get(key) or 0)]
              for key in keys if key in ids}
    records = _private.asset_event_records(
        instance, [i for new in wanted.values() for i in new]) if wanted else {}
    out: dict[dg.AssetKey, list[dg.EventLogRecord]] = {}
    for key in keys:
        new = wanted.get(key)
        if records is not None and new is not None and all(i in records for i in new):
            out[key] = [records[i] for i in new]
        else:
            out[key] = _fetch(instance, event_type, key, limit, after.get(key) or 0)
    return out


def run_records(instance: dg.DagsterInstance, run_ids: Sequence[str]) -> dict[str, Any]:
    """run id -> run record, in one query per 2,000 ids (a query per run costs about 5
    ms each)."""
    ids = sorted(set(run_ids))
    out = {}
    for start in range(0, len(ids), _RUN_IDS_PER_QUERY):
        chunk = ids[start:start + _RUN_IDS_PER_QUERY]
        for r in instance.get_run_records(dg.RunsFilter(run_ids=chunk)):
            out[r.dagster_run.run_id] = r
    return out


def newest_runs(instance: dg.DagsterInstance, tag: str, values: Sequence[str]
                ) -> dict[str, Any]:
    """value -> the newest run record tagged `tag: value` (what
    `get_run_records(RunsFilter(tags={tag: value}), limit=1)` returns); a value without
    a run is absent."""
    values = list(dict.fromkeys(values))
    ids = (_private.newest_tagged_run_ids(instance, tag, values)
           if len(values) >= BATCH_FROM else None)
    found = run_records(instance, list(ids.values())) if ids else {}
    out = {}
    for value in values:
        run_id = ids.get(value) if ids is not None else None
        if run_id is not None and run_id in found:
            out[value] = found[run_id]
        elif ids is None or run_id is not None:  # one at a time, or deleted meanwhile
            records = instance.get_run_records(dg.RunsFilter(tags={tag: value}), limit=1)
            if records:
                out[value] = records[0]
    return out
