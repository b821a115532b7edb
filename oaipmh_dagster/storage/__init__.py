"""The database: engine and migrations, the harvester registry, the record store, the lease and checkpoint (no Dagster import)."""
