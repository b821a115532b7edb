"""PostgreSQL: the provider's lists keep one index of the hub's change time, 0011's
`ix_oaipmh_record_changed` (harvested_at, harvester_id, oai_identifier); the other,
`ix_oaipmh_record_harvester_changed` (harvester_id, harvested_at, oai_identifier), is
dropped. Each partition holds one harvester (0010), so in a partition both orders are
the same: the planner served one harvester's list from the first index already, and
the second cost a fourth index entry (and its WAL) for every record written. SQLite,
one table for every harvester, keeps both.

The DROP takes an ACCESS EXCLUSIVE lock on `oaipmh_record` for as long as it takes to
unlink the indexes' files; the downgrade builds the index again on every partition.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

from oaipmh_dagster.storage import partitions

revision = "0013"
down_revision = "0012"

HARVESTER_CHANGED = "ix_oaipmh_record_harvester_changed"


def _partitioned() -> bool:
    conn = op.get_bind()
    return conn.dialect.name == "postgresql" and partitions.is_partitioned(conn)


def upgrade() -> None:
    if _partitioned():
        op.execute(f"DROP INDEX IF EXISTS {HARVESTER_CHANGED}")


def downgrade() -> None:
    if _partitioned():
        op.create_index(HARVESTER_CHANGED, "oaipmh_record",
                        ["harvester_id", "harvested_at", "oai_identifier"])
