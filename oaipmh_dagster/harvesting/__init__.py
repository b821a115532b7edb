"""One harvest: plan, pages, commits, windows, reconcile and sweep (no Dagster import)."""
