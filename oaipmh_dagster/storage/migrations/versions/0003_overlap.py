"""Per-harvester since overlap (seconds; NULL: the default for the server's granularity).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.add_column(sa.Column("overlap", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.drop_column("overlap")
