"""Alembic environment: runs on the connection handed in by `oaipmh_dagster.storage.db.upgrade`."""

from alembic import context

from oaipmh_dagster.storage.db import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
