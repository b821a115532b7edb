"""Sweep safety: the most records a sweep may tombstone without confirmation
(`oaipmh_harvester.max_delete`, a share such as 10% or a count; every existing row gets
the default 10%), and the selection whose records the store holds
(`oaipmh_harvest_state.selection`, a fingerprint of URL, prefix and sets; NULL: unknown,
adopted at the next harvest that covers the selection).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.add_column(sa.Column("max_delete", sa.String(16), nullable=False,
                                   server_default="10%"))
    with op.batch_alter_table("oaipmh_harvest_state") as batch:
        batch.add_column(sa.Column("selection", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oaipmh_harvest_state") as batch:
        batch.drop_column("selection")
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.drop_column("max_delete")
