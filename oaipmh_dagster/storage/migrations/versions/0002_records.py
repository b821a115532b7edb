"""The record store and the per-harvester harvest state (lease + checkpoint).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "oaipmh_record",
        sa.Column("harvester_id", sa.String(48), primary_key=True),
        sa.Column("oai_identifier", sa.String(1024), primary_key=True),
        sa.Column("datestamp", sa.String(32), nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("sets", JSON, nullable=False),
        sa.Column("raw_xml", sa.Text, nullable=True),
        sa.Column("metadata", JSON, nullable=True),
        sa.Column("errors", JSON, nullable=False),
        sa.Column("harvested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("transformed_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_oaipmh_record_datestamp", "oaipmh_record", ["harvester_id", "datestamp"])
    op.create_table(
        "oaipmh_harvest_state",
        sa.Column("harvester_id", sa.String(48), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("holder", sa.String(255), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("checkpoint", JSON, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("oaipmh_harvest_state")
    op.drop_index("ix_oaipmh_record_datestamp", "oaipmh_record")
    op.drop_table("oaipmh_record")
