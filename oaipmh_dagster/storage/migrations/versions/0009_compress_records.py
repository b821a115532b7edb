"""Compressed records on PostgreSQL: `raw_xml` and `metadata` use lz4 (faster than the
default pglz at a similar ratio), and the record table's TOAST tuple target drops from
about 2 KiB to 256 bytes, so that the typical record of one or two KiB is compressed
too (by default only rows over 2 KiB are). Rows written before stay as they were until
they are written again (a re-harvest, or `VACUUM FULL oaipmh_record`). A server built
without lz4 keeps pglz. SQLite: nothing changes.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"

COLUMNS = ("raw_xml", "metadata")
TUPLE_TARGET = 256


def _version(conn: sa.Connection) -> tuple:
    return tuple(conn.dialect.server_version_info or (0,))


def _lz4_available(conn: sa.Connection) -> bool:
    """Whether the server was built with lz4 (PostgreSQL 14 and later)."""
    if _version(conn) < (14,):
        return False
    with conn.begin_nested():
        try:
            conn.exec_driver_sql("SET LOCAL default_toast_compression = 'lz4'")
        except sa.exc.DBAPIError:
            return False
    return True


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    if _lz4_available(conn):
        for column in COLUMNS:
            op.execute(f"ALTER TABLE oaipmh_record ALTER COLUMN {column} SET COMPRESSION lz4")
    op.execute(f"ALTER TABLE oaipmh_record SET (toast_tuple_target = {TUPLE_TARGET})")


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    if _version(conn) >= (14,):
        for column in COLUMNS:
            op.execute(f"ALTER TABLE oaipmh_record ALTER COLUMN {column} SET COMPRESSION DEFAULT")
    op.execute("ALTER TABLE oaipmh_record RESET (toast_tuple_target)")
