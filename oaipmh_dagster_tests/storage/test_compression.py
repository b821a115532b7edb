"""Raw XML and metadata are compressed on PostgreSQL (lz4, and a TOAST tuple target low
enough that a record of one or two KiB is compressed too, not only rows over 2 KiB);
the migration's downgrade restores PostgreSQL's defaults. SQLite stores them as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from oaipmh_dagster.storage import db
from oaipmh_dagster_tests.conftest import _clean_postgres

RAW = ("<record><header><identifier>oai:x:1</identifier></header><metadata>"
       + "".join(f"<dc:subject>subject number {i} of a long list</dc:subject>"
                 for i in range(40))
       + "</metadata></record>")  # about 2 KiB: under the default 2 KiB TOAST threshold
INSERT = sa.text(
    "INSERT INTO oaipmh_record (harvester_id, oai_identifier, datestamp, deleted, sets, "
    "raw_xml, metadata, errors, harvested_at) VALUES ('h', :id, '2020-01-01', false, "
    "'[]', :raw, :meta, '[]', CURRENT_TIMESTAMP)")


@pytest.fixture
def pg(pg_database: str) -> Iterator[sa.Engine]:
    db.dispose_all()
    _clean_postgres(pg_database)
    engine = db.get_engine(pg_database)
    yield engine
    db.dispose_all()


def _settings(engine: sa.Engine, table: str = "oaipmh_record") -> tuple[dict[str, str],
                                                                       list[str]]:
    with engine.connect() as conn:
        methods = dict(conn.execute(sa.text(
            "SELECT attname, attcompression FROM pg_attribute WHERE attrelid = "
            "to_regclass(:t) AND attname IN ('raw_xml', 'metadata')"), {"t": table}).all())
        options = conn.execute(sa.text(
            "SELECT reloptions FROM pg_class WHERE oid = to_regclass(:t)"),
            {"t": table}).scalar()
    return methods, list(options or [])


@pytest.mark.postgres
def test_postgres_compresses_raw_xml_and_metadata(pg: sa.Engine) -> None:
    # A partitioned table keeps no storage parameters: its partitions do (0010).
    assert _settings(pg)[0] == {"raw_xml": "l", "metadata": "l"}
    methods, options = _settings(pg, "oaipmh_record__default")
    assert methods == {"raw_xml": "l", "metadata": "l"}
    assert "toast_tuple_target=256" in options
    meta = '{"subject": [' + ", ".join(f'"subject number {i}"' for i in range(60)) + "]}"
    with pg.begin() as conn:
        conn.execute(INSERT, {"id": "oai:x:1", "raw": RAW, "meta": meta})
    with pg.connect() as conn:
        raw, raw_size, raw_len, meta_size = conn.execute(sa.text(
            "SELECT raw_xml, pg_column_size(raw_xml), octet_length(raw_xml), "
            "pg_column_size(metadata) FROM oaipmh_record")).one()
    assert raw == RAW
    assert raw_size < raw_len / 4
    assert meta_size < len(meta) / 2


@pytest.mark.postgres
def test_the_downgrade_restores_postgres_defaults(pg: sa.Engine) -> None:
    from alembic import command

    with pg.begin() as conn:
        command.downgrade(db._alembic_config(conn), "0008")
    methods, options = _settings(pg)
    assert set(methods.values()) == {""} and options == []
    with pg.begin() as conn:
        command.upgrade(db._alembic_config(conn), "head")
    assert _settings(pg)[0] == {"raw_xml": "l", "metadata": "l"}


def test_sqlite_stores_the_same_text(sqlite_url: str) -> None:
    engine = db.get_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(INSERT, {"id": "oai:x:1", "raw": RAW, "meta": "{}"})
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT raw_xml FROM oaipmh_record")).scalar() == RAW
