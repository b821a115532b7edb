"""Helpers shared by tests: registering harvesters against a loopback server."""

from __future__ import annotations

from oaipmh_dagster.storage.registry import Harvester, Registry


def add_harvester(harvester_id: str, base_url: str, **fields: object) -> Harvester:
    """Register a harvester directly (no probe) in the current database."""
    h = Harvester(id=harvester_id, base_url=base_url,
                  metadata_prefix=str(fields.pop("metadata_prefix", "oai_dc")), **fields)
    return Registry().add(h)


def expected_snapshot(dataset, prefix: str = "oai_dc", sets: tuple[str, ...] = ()) -> dict:  # noqa: ANN001
    """identifier -> (datestamp, deleted, sets) of what a harvest of `dataset` must store."""
    from oaipmh_dagster.storage.store import utc_datestamp

    out = {}
    for rec in dataset:
        if sets and not any(rec.in_set(s) for s in sets):
            continue
        if not rec.deleted and prefix not in rec.metadata:
            continue
        out[rec.identifier] = (utc_datestamp(rec.datestamp), rec.deleted, tuple(rec.sets))
    return out
