"""Tests of the metadata transformers (mirrors ``oaipmh_dagster.transform``)."""
