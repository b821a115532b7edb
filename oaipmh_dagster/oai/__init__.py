"""The OAI-PMH protocol: a client for the six verbs, parsing and datestamps.

No Dagster and no database in here: httpx and lxml only. ``__all__`` is the public
face; the modules whose names start with ``_`` are private:

* ``client``: :class:`OAIClient`, the facade for the six verbs;
* ``_options``: :class:`ClientOptions` and the User-Agent;
* ``_transport``: HTTP (per-host limits and pacing, redirects, retries, gzip, size);
* ``_deadline``: request deadlines and cancellation;
* ``_paging``: resumptionToken chains (loops, restart, prefetch);
* ``parse``: each verb's answer as plain objects (``models``), over ``_xml``, the
  hardened parser, and ``_charset``, the encoding rules;
* ``errors``: one exception per OAI-PMH error code, and the transport and data errors.
"""

from ._options import DEFAULT_USER_AGENT, ClientOptions, LoggerLike
from ._transport import redact_url
from ._xml import hardened_parser
from .client import OAIClient, drop_seen
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
    "BadArgument",
    "BadResumptionToken",
    "BadVerb",
    "Cancelled",
    "CannotDisseminateFormat",
    "ClientOptions",
    "ClientStats",
    "DEFAULT_USER_AGENT",
    "DatestampError",
    "Granularity",
    "Header",
    "IdDoesNotExist",
    "Identify",
    "LoggerLike",
    "MetadataFormat",
    "NoMetadataFormats",
    "NoRecordsMatch",
    "NoSetHierarchy",
    "OAIClient",
    "OAIDataError",
    "OAIError",
    "OAIHTTPStatusError",
    "OAIProtocolError",
    "OAISet",
    "OAITransportError",
    "Page",
    "Record",
    "ResumptionToken",
    "drop_seen",
    "format_datestamp",
    "hardened_parser",
    "parse_datestamp",
    "parse_user_datetime",
    "redact_url",
]
