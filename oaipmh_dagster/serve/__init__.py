"""The hub as an OAI-PMH 2.0 data provider over its record store (`oaipmh-dagster
serve`): no Dagster import; it reads the registry and the store by SQL.

`create_app(engine, settings)` is the ASGI application; `Settings.from_env()` its
configuration (`OAIPMH_SERVE_*`); `SCHEMA` the shipped OAI-PMH 2.0 response schema."""

from pathlib import Path

from oaipmh_dagster.serve.app import create_app
from oaipmh_dagster.serve.settings import BadSetting, Settings

SCHEMA = Path(__file__).with_name("OAI-PMH.xsd")

__all__ = ["SCHEMA", "BadSetting", "Settings", "create_app"]
