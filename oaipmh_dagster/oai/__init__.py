"""The OAI-PMH protocol: a client for the six verbs, parsing and datestamps.

No Dagster and no database in here: httpx and lxml only.
"""

from .client import DEFAULT_USER_AGENT, ClientOptions, LoggerLike, OAIClient, redact_url
from .datestamps import Granularity, format_datestamp, parse_datestamp, parse_user_datetime
from .errors import (
    BadArgument,
    BadResumptionToken,
    BadVerb,
    Cancelled,
    CannotDisseminateFormat,
    DataError,
    DatestampError,
    HTTPStatusError,
    IdDoesNotExist,
    NoMetadataFormats,
    NoRecordsMatch,
    NoSetHierarchy,
    OAIError,
    ProtocolError,
    TransportError,
)
from .models import (
    ClientStats,
    Header,
    Identify,
    MetadataFormat,
    OAISet,
    Page,
    Record,
    ResumptionToken,
)

__all__ = [
    "DEFAULT_USER_AGENT",
    "BadArgument",
    "BadResumptionToken",
    "BadVerb",
    "Cancelled",
    "CannotDisseminateFormat",
    "ClientOptions",
    "ClientStats",
    "DataError",
    "DatestampError",
    "Granularity",
    "HTTPStatusError",
    "Header",
    "IdDoesNotExist",
    "Identify",
    "LoggerLike",
    "MetadataFormat",
    "NoMetadataFormats",
    "NoRecordsMatch",
    "NoSetHierarchy",
    "OAIClient",
    "OAIError",
    "OAISet",
    "Page",
    "ProtocolError",
    "Record",
    "ResumptionToken",
    "TransportError",
    "format_datestamp",
    "parse_datestamp",
    "parse_user_datetime",
    "redact_url",
]
