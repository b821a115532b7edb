"""The harvester registry.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "oaipmh_harvester",
        sa.Column("id", sa.String(48), primary_key=True),
        sa.Column("name", sa.String(255), nullable=False, server_default=""),
        sa.Column("base_url", sa.String(2048), nullable=False),
        sa.Column("metadata_prefix", sa.String(255), nullable=False),
        sa.Column("sets", sa.JSON, nullable=False),
        sa.Column("transformer", sa.String(255), nullable=False),
        sa.Column("cron", sa.String(255), nullable=True),
        sa.Column("timezone", sa.String(64), nullable=False, server_default="UTC"),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("comment", sa.Text, nullable=False, server_default=""),
        sa.Column("timeout", sa.Float, nullable=False, server_default="60"),
        sa.Column("delay", sa.Float, nullable=False, server_default="0"),
        sa.Column("max_parallel", sa.Integer, nullable=False, server_default="1"),
        sa.Column("max_retries", sa.Integer, nullable=False, server_default="5"),
        sa.Column("auth_env", sa.String(255), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("oaipmh_harvester")
