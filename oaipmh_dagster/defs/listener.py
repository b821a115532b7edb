"""The run-scoped listener of a harvest: a resource the harvest op reports its pages and
statistics to (nothing by default; the CLI sets one for the run it executes)."""

from __future__ import annotations

import dagster as dg

from oaipmh_dagster.harvesting.harvest import Listener

LISTENER_KEY = "oaipmh_listener"


def listener_resource(listener: Listener | None = None) -> dg.ResourceDefinition:
    """The resource that hands `listener` (default: one that ignores everything) to the op."""
    return dg.ResourceDefinition.hardcoded_resource(
        listener or Listener(), "Receives each committed page and the final statistics."
    )
