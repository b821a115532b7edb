"""Deployment-wide settings, one row per key: the number of shards (`shards`) that
`oaipmh-dagster workspace --shards K` stores and every code location reads, so that
code location names need not carry it.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_table(
        "oaipmh_setting",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("oaipmh_setting")
