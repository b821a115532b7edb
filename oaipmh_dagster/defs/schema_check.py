"""The asset check `schema_valid` on `raw_records` of a harvester that validates its
records against an XML Schema or an ISO Schematron: how many live records in the store
are invalid (errors of type schema or schematron)."""

import dagster as dg

from oaipmh_dagster.contracts import CHECK_SCHEMA_VALID
from oaipmh_dagster.storage.ports import RecordStore
from oaipmh_dagster.storage.registry import Harvester

__all__ = ["SAMPLE", "schema_check_result", "schema_check_spec"]

SAMPLE = 10  # invalid records named in the check's metadata


def schema_check_spec(h: Harvester, raw_key: dg.AssetKey) -> dg.AssetCheckSpec | None:
    """The check's spec, for a harvester that validates (None otherwise)."""
    if h.schema is None:
        return None
    return dg.AssetCheckSpec(
        CHECK_SCHEMA_VALID, asset=raw_key,
        description=f"Every live record is valid against the schema {h.schema} (warning; "
        "invalid records are kept, with an error of type schema or schematron).")


def schema_check_result(store: RecordStore, h: Harvester, raw_key: dg.AssetKey,
                        live: int | None = None) -> dg.AssetCheckResult:
    """The check's result: failed (a warning) when any live record is invalid, with the
    invalid and live counts (`live`: counted when not given) and the first invalid
    records (identifier: first message)."""
    if h.schema is None:
        return dg.AssetCheckResult(
            asset_key=raw_key, check_name=CHECK_SCHEMA_VALID, passed=True,
            metadata={"note": "validation was switched off after the code location loaded"})
    invalid = store.schema_invalid(h.id, sample=SAMPLE)
    live = store.count(h.id) if live is None else live
    sample = "\n".join(f"- {identifier}: {message}" for identifier, message in invalid.sample)
    return dg.AssetCheckResult(
        asset_key=raw_key, check_name=CHECK_SCHEMA_VALID, passed=invalid.count == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "invalid": invalid.count,
            "live": live,
            "schema": h.schema,
            "invalid_sample": dg.MetadataValue.md(sample or "_none_"),
        },
    )
