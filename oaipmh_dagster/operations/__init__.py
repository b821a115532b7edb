"""What operators do beside a harvest: add/update/remove, look at an endpoint, export, profile, reload, shards (no Dagster import)."""
