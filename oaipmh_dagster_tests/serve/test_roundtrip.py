"""The hub under uvicorn, harvested by this project's own client (into a second store)
and by Sickle: what comes back is what the hub stored."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from lxml import etree

from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.oai import ClientOptions, OAIClient
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.store import Store, record_table
from oaipmh_dagster_tests.serve.conftest import Running


def _c14n(xml: str | bytes) -> bytes:
    """Canonical XML without the namespaces declared but unused (a harvest serializes the
    element with the envelope's declarations in scope)."""
    data = xml.encode() if isinstance(xml, str) else xml
    return etree.tostring(etree.fromstring(data), method="c14n", exclusive=True)


def _stored(engine: sa.Engine) -> dict[str, tuple[bool, str | None]]:
    c = record_table.c
    with engine.connect() as conn:
        rows = conn.execute(sa.select(c.harvester_id, c.oai_identifier, c.deleted, c.raw_xml)
                            .where(c.harvester_id.in_(["h1", "h2"]))).all()
    return {f"oai:hub:{h}:{i}": (bool(d), raw) for h, i, d, raw in rows}


def test_our_harvester_round_trips_the_hub(served: Running, tmp_path: Path) -> None:
    options = ClientOptions(max_retries=0, read_timeout=10)
    with OAIClient(served.url, options) as client:
        identify = client.identify()
        assert client.granularity.value == "YYYY-MM-DDThh:mm:ssZ"
        records = list(client.list_records("oai_dc"))
        one = client.get_record("oai:hub:h2:oai:src:r4", "oai_dc")
        h1_only = [h.identifier for h in client.list_identifiers("oai_dc", sets=["h1"])]
    assert identify.repository_name == "oaipmh-dagster hub"
    stored = _stored(served.engine)
    assert sorted(r.header.identifier for r in records) == sorted(stored)
    assert len(h1_only) == 10 and all(i.startswith("oai:hub:h1:") for i in h1_only)
    # Harvested into a store of its own: the same XML and tombstones as the hub's.
    mirror = db.get_engine(f"sqlite:///{tmp_path / 'mirror.sqlite'}")
    write_page(Store(mirror), "mirror", records, run_id=None)
    mirrored = {k.removeprefix("mirror:"): v for k, v in _stored_of(mirror).items()}
    assert set(mirrored) == set(stored)
    for identifier, (deleted, raw) in stored.items():
        assert mirrored[identifier][0] == deleted
        if raw is None:
            assert mirrored[identifier][1] is None
        else:
            assert _c14n(mirrored[identifier][1] or "") == _c14n(raw)
    assert one.metadata is not None and _c14n(one.metadata) == _c14n(
        stored["oai:hub:h2:oai:src:r4"][1] or "")


def _stored_of(engine: sa.Engine) -> dict[str, tuple[bool, str | None]]:
    c = record_table.c
    with engine.connect() as conn:
        rows = conn.execute(sa.select(c.oai_identifier, c.deleted, c.raw_xml)).all()
    return {i: (bool(d), raw) for i, d, raw in rows}


def test_sickle_harvests_the_hub(served: Running) -> None:
    from sickle import Sickle

    sickle = Sickle(served.url, max_retries=0, timeout=10)
    headers = list(sickle.ListIdentifiers(metadataPrefix="oai_dc", ignore_deleted=False))
    records = list(sickle.ListRecords(metadataPrefix="oai_dc", set="h2",
                                      ignore_deleted=True))
    assert len(headers) == 20 and len({h.identifier for h in headers}) == 20
    assert sorted(r.header.identifier for r in records) == sorted(
        f"oai:hub:h2:oai:src:r{i}" for i in range(10) if i != 3)
    assert {r.metadata["title"][0] for r in records} == {
        f"h2 r{i}" for i in range(10) if i != 3}
