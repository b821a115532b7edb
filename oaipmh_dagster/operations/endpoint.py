"""What an OAI-PMH endpoint says about itself (Identify, sets, metadata formats) as plain
JSON-ready objects: for looking at an endpoint before registering it, and for checking
a harvester's prefix and sets against it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from oaipmh_dagster.oai import ClientOptions, Identify, MetadataFormat, OAIClient, OAISet

__all__ = ["describe_formats", "describe_identify", "describe_sets", "missing_sets",
           "probe_options", "some"]

SHOWN = 10  # offered values named in a refusal


def probe_options(timeout: float) -> ClientOptions:
    """Client options for a quick look: one retry, the given read timeout."""
    return ClientOptions(read_timeout=timeout, connect_timeout=min(10.0, timeout),
                         max_retries=1, backoff_base=0.5)


class _Quiet:
    """A logger that keeps the client's retry notes off a command's stderr (its error is
    the one line)."""

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        pass

    info = warning = error = debug


def client(url: str, timeout: float) -> OAIClient:
    """A client for a quick look at `url`, without log output."""
    return OAIClient(url, probe_options(timeout), logger=_Quiet())


def describe_identify(ident: Identify) -> dict[str, Any]:
    """Identify as a JSON object (datestamps in UTC with a `Z`)."""
    earliest = ident.earliest_datestamp
    return {
        "repository_name": ident.repository_name,
        "base_url": ident.base_url,
        "protocol_version": ident.protocol_version,
        "granularity": ident.granularity.value,
        "earliest_datestamp": earliest.strftime("%Y-%m-%dT%H:%M:%SZ") if earliest else None,
        "deleted_record": ident.deleted_record,
        "admin_emails": list(ident.admin_emails),
        "compression": list(ident.compression),
    }


def describe_sets(sets: Iterable[OAISet]) -> list[dict[str, str]]:
    """Sets as JSON objects {spec, name}."""
    return [{"spec": s.spec, "name": s.name} for s in sets]


def describe_formats(formats: Iterable[MetadataFormat]) -> list[dict[str, str]]:
    """Metadata formats as JSON objects {prefix, schema, namespace}."""
    return [{"prefix": f.prefix, "schema": f.schema, "namespace": f.namespace}
            for f in formats]


def some(values: list[str], shown: int = SHOWN) -> str:
    """The first `shown` values, comma-separated, with "and N more" for the rest."""
    text = ", ".join(values[:shown])
    return text + (f" and {len(values) - shown} more" if len(values) > shown else "")


def missing_sets(wanted: Iterable[str], offered: Iterable[str]) -> list[str]:
    """The wanted set specs the endpoint does not list, in the order given."""
    known = set(offered)
    return [spec for spec in dict.fromkeys(wanted) if spec not in known]
