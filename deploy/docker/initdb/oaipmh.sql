-- The harvester registry and the records get a database of their own beside Dagster's
-- storage (sharing one works too: their version table is oaipmh_alembic_version).
CREATE DATABASE oaipmh OWNER dagster;
