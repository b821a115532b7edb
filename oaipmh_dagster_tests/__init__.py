"""Tests of oaipmh-dagster."""
