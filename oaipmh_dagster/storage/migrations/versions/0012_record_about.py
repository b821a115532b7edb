"""A record's `<about>` blocks (provenance, rights): `oaipmh_record.about`, a JSON list
of each block's content as XML text; NULL when the record has none (every row before
this revision: the next harvest that finds a record's about blocks stores them, since
they are part of the record's content hash). On PostgreSQL the column is added to the
partitioned table and so to every partition, with lz4 like `raw_xml`.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.add_column("oaipmh_record", sa.Column("about", postgresql.JSONB(), nullable=True))
        op.execute("ALTER TABLE oaipmh_record ALTER COLUMN about SET COMPRESSION lz4")
        return
    with op.batch_alter_table("oaipmh_record") as batch:
        batch.add_column(sa.Column("about", sa.JSON(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_column("oaipmh_record", "about")
        return
    with op.batch_alter_table("oaipmh_record") as batch:
        batch.drop_column("about")
