"""Lineage of a harvester's assets: the code version of `records` (what made them), the
observation of `source` from the Identify each harvest reads, and the table the records
live in (`dagster/table_name`, `dagster/row_count` on each materialization)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Generator
from typing import Any

import dagster as dg

from oaipmh_dagster import __version__
from oaipmh_dagster.oai import Identify
from oaipmh_dagster.operations.endpoint import describe_identify
from oaipmh_dagster.storage.ports import RecordStore
from oaipmh_dagster.transform import transformer_version

__all__ = ["IDENTIFY_DIGEST_KEY", "ROW_COUNT_KEY", "TABLE_NAME_KEY", "identify_version", "observe_source", "records_code_version",
           "source_observation", "table_metadata"]

# Dagster's table metadata keys, and the digest of an Identify answer on observations.
TABLE_NAME_KEY = "dagster/table_name"
ROW_COUNT_KEY = "dagster/row_count"
IDENTIFY_DIGEST_KEY = "oai/identify_digest"


def records_code_version(transformer: str) -> str:
    """The code version of a harvester's `records`: the transformer and the package
    version, plus a digest of what stands behind the name (a built-in's source and the
    package modules it imports, the stylesheet's bytes, a plugin's distribution version
    and source). It changes exactly when what
    transforms the stored XML changes, so Dagster shows `records` as stale then."""
    name = transformer.strip()
    behind = transformer_version(name)
    if behind == name:
        return f"{name}@{__version__}"
    digest = hashlib.sha256(behind.encode()).hexdigest()[:12]
    return f"{name}@{__version__}+{digest}"


def identify_version(ident: Identify) -> str:
    """A digest of what Identify says about the repository (not its responseDate, which
    changes with every request): equal answers give equal versions."""
    text = json.dumps(describe_identify(ident), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def source_observation(key: dg.AssetKey, ident: Identify) -> dg.AssetObservation:
    """The observation of a harvester's `source` from its Identify answer.

    The digest is metadata, not the observation's data version: Dagster reads the data
    version of a source only from an observable asset (one with an observe function),
    while the step that harvests records it as raw_records' input, so with it
    raw_records would show as stale ("has a new dependency data version") after every
    harvest but the first."""
    described = describe_identify(ident)
    return dg.AssetObservation(
        asset_key=key,
        metadata={
            "repositoryName": described["repository_name"],
            "baseURL": described["base_url"],
            "protocolVersion": described["protocol_version"],
            "granularity": described["granularity"],
            "earliestDatestamp": described["earliest_datestamp"] or "",
            "deletedRecord": described["deleted_record"],
            "adminEmail": ", ".join(described["admin_emails"]),
            IDENTIFY_DIGEST_KEY: identify_version(ident),
        },
    )


def observe_source(
    key: dg.AssetKey, harvest: Callable[[Callable[[Identify], None]], Any],
) -> Generator[dg.AssetObservation, None, Any]:
    """Call `harvest` with a callback for the Identify it reads, then yield the
    observation of `key` from that answer, also when the harvest fails after Identify;
    return what `harvest` returned."""
    seen: list[Identify] = []
    try:
        result = harvest(seen.append)
    except Exception:
        if seen:
            yield source_observation(key, seen[0])
        raise
    if seen:
        yield source_observation(key, seen[0])
    return result


def table_metadata(store: RecordStore, harvester_id: str,
                   live: int | None = None) -> dict[str, Any]:
    """`dagster/table_name` and `dagster/row_count` (the harvester's live rows; one
    COUNT unless `live` is given) of the record table."""
    if live is None:
        live = store.count(harvester_id)
    return {TABLE_NAME_KEY: store.table_name(), ROW_COUNT_KEY: live}
