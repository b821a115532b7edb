"""Indexes of the OAI-PMH data provider (`oaipmh-dagster serve`): its lists run in the
order of the hub's change time, (harvested_at, harvester_id, oai_identifier), over all
harvesters or over one (a set), and page by keyset from a position in that order. Each
page is then an index range scan that starts at the position, however deep in the
list, instead of a sort of the whole selection.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"

CHANGED = "ix_oaipmh_record_changed"
HARVESTER_CHANGED = "ix_oaipmh_record_harvester_changed"


def upgrade() -> None:
    op.create_index(CHANGED, "oaipmh_record", ["harvested_at", "harvester_id", "oai_identifier"])
    op.create_index(HARVESTER_CHANGED, "oaipmh_record",
                    ["harvester_id", "harvested_at", "oai_identifier"])


def downgrade() -> None:
    op.drop_index(HARVESTER_CHANGED, "oaipmh_record")
    op.drop_index(CHANGED, "oaipmh_record")
