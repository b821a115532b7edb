"""Content hash per record (rows from before count as changed once) and a lease token
per harvest state (fenced writes).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.add_column("oaipmh_record", sa.Column("content_hash", sa.String(32), nullable=True))
    op.add_column("oaipmh_harvest_state", sa.Column("lease", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oaipmh_harvest_state") as batch:
        batch.drop_column("lease")
    with op.batch_alter_table("oaipmh_record") as batch:
        batch.drop_column("content_hash")
