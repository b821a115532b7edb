"""Per-harvester XML Schema validation: the schema records are validated against (a
shipped one's name or a file's path; NULL: no validation, as every existing row).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.add_column(sa.Column("schema", sa.String(2048), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("oaipmh_harvester") as batch:
        batch.drop_column("schema")
