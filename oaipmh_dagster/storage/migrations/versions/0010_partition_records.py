"""Records partitioned by harvester on PostgreSQL: `oaipmh_record` becomes a LIST-
partitioned table with one partition per harvester (`oaipmh_record_<id>`) and a DEFAULT
partition (`oaipmh_record__default`); see `storage/partitions.py`. A harvester's queries
then cost what its own records cost, whatever else the store holds, and removing its
records drops one table.

Upgrade: the table is renamed `oaipmh_record_0009`, the partitioned table made in its
place with the same columns, key, index and lz4 compression (the partitions get the
toast_tuple_target of 0009, plus a fillfactor and autovacuum settings), each stored
harvester's rows copied into its partition (and a partition made for every registered
harvester), and the old table dropped. The harvest state (leases, checkpoints) is
another table and stays as it is. It copies every record once, in one transaction:
reckon a minute or so per million records, and twice the table's size of free disk
while it runs.

Downgrade: the reverse copy into one plain table, with 0009's compression settings.

SQLite: nothing changes (one table, as before).

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

from oaipmh_dagster.storage import partitions

revision = "0010"
down_revision = "0009"

OLD = "oaipmh_record_0009"
INDEX = "ix_oaipmh_record_datestamp"


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql" or partitions.is_partitioned(conn):
        return
    op.execute(f"ALTER TABLE oaipmh_record RENAME TO {OLD}")
    op.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT oaipmh_record_pkey TO {OLD}_pkey")
    op.execute(f"ALTER INDEX {INDEX} RENAME TO ix_{OLD}_datestamp")
    op.execute(
        f"CREATE TABLE oaipmh_record (LIKE {OLD} INCLUDING DEFAULTS INCLUDING STORAGE "
        "INCLUDING COMPRESSION) PARTITION BY LIST (harvester_id)")
    op.execute("ALTER TABLE oaipmh_record ADD CONSTRAINT oaipmh_record_pkey "
               "PRIMARY KEY (harvester_id, oai_identifier)")
    op.execute(f"CREATE INDEX {INDEX} ON oaipmh_record (harvester_id, datestamp)")
    partitions.create_default_in(conn)
    stored = set(conn.execute(sa.text(
        # one index probe per harvester instead of a scan of every row
        f"WITH RECURSIVE h(id) AS (SELECT min(harvester_id) FROM {OLD} "  # noqa: S608
        f"UNION ALL SELECT (SELECT min(harvester_id) FROM {OLD} WHERE harvester_id > h.id) "
        "FROM h WHERE h.id IS NOT NULL) SELECT id FROM h WHERE id IS NOT NULL")).scalars())
    registered = set(conn.execute(sa.text("SELECT id FROM oaipmh_harvester")).scalars())
    for harvester_id in sorted(stored | registered):
        partitions.create_in(conn, harvester_id, copy_from=OLD if harvester_id in stored
                             else None)
    op.execute(f"DROP TABLE {OLD}")


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql" or not partitions.is_partitioned(conn):
        return
    op.execute(f"ALTER TABLE oaipmh_record RENAME TO {OLD}")
    op.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT oaipmh_record_pkey TO {OLD}_pkey")
    op.execute(f"ALTER INDEX {INDEX} RENAME TO ix_{OLD}_datestamp")
    op.execute(
        f"CREATE TABLE oaipmh_record (LIKE {OLD} INCLUDING DEFAULTS INCLUDING STORAGE "
        "INCLUDING COMPRESSION) WITH (toast_tuple_target = 256)")
    cols = ", ".join(partitions.columns(conn, OLD))
    op.execute(f"INSERT INTO oaipmh_record ({cols}) SELECT {cols} FROM {OLD}")  # noqa: S608
    op.execute("ALTER TABLE oaipmh_record ADD CONSTRAINT oaipmh_record_pkey "
               "PRIMARY KEY (harvester_id, oai_identifier)")
    op.execute(f"CREATE INDEX {INDEX} ON oaipmh_record (harvester_id, datestamp)")
    op.execute(f"DROP TABLE {OLD}")  # its partitions with it
