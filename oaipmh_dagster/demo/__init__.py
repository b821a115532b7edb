"""A loopback OAI-PMH server with a realistic sample data set."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oaipmh_dagster.demo.dataset import Dataset, ServedRecord, make_dataset

if TYPE_CHECKING:
    from oaipmh_dagster.demo.server import OAIServer, RequestLog

__all__ = ["Dataset", "OAIServer", "RequestLog", "ServedRecord", "make_dataset"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `python -m oaipmh_dagster.demo.server` runs without warnings.
    if name in ("OAIServer", "RequestLog"):
        from oaipmh_dagster.demo import server

        return getattr(server, name)
    raise AttributeError(name)
