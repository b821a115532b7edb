"""The thin Dagster layer: factories that turn a `Harvester` into definitions."""
