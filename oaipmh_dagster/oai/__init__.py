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
    DatestampError,
    IdDoesNotExist,
    NoMetadataFormats,
    NoRecordsMatch,
    NoSetHierarchy,
    OAIDataError,
    OAIError,
    OAIHTTPStatusError,
    OAIProtocolError,
    OAITransportError,
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
    "OAIDataError",
    "DatestampError",
    "Granularity",
    "OAIHTTPStatusError",
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
    "OAIProtocolError",
    "Record",
    "ResumptionToken",
    "OAITransportError",
    "format_datestamp",
    "parse_datestamp",
    "parse_user_datetime",
    "redact_url",
]
