"""A loopback OAI-PMH server with a realistic sample data set and fault injection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oaipmh_dagster.demo.dataset import Dataset, ServedRecord, make_dataset

if TYPE_CHECKING:
    from oaipmh_dagster.demo.server import FaultPlan, OAIServer, RequestLog

__all__ = ["Dataset", "FaultPlan", "OAIServer", "RequestLog", "ServedRecord", "make_dataset"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `python -m oaipmh_dagster.demo.server` runs without warnings.
    if name in ("FaultPlan", "OAIServer", "RequestLog"):
        from oaipmh_dagster.demo import server

        return getattr(server, name)
    raise AttributeError(name)
