"""oaipmh-dagster: OAI-PMH harvesters as a Dagster code location."""

__version__ = "0.1.0"
