"""Per-harvester reconcile cadence: every Nth scheduled run reconciles (NULL: never).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.add_column(sa.Column("reconcile_every", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.drop_column("reconcile_every")
