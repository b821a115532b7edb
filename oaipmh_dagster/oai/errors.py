"""Exceptions of the OAI-PMH client.

Three families under :class:`OAIError` (itself under the package root
:class:`~oaipmh_dagster.errors.OAIPMHDagsterError`), so a caller can tell them apart:

* :class:`OAIProtocolError`: the server answered with an OAI-PMH ``<error>``;
  one subclass per error code, looked up by the code's name.
* :class:`OAITransportError`: the server could not be asked (connection, timeout,
  HTTP status without an OAI-PMH body, retries exhausted).
* :class:`OAIDataError`: the server answered, but the answer is unusable
  (not well-formed, HTML, too large, unsafe, a resumption token loop ...).
"""

from __future__ import annotations

from datetime import datetime

from oaipmh_dagster.errors import OAIPMHDagsterError

__all__ = [
    "OAIError",
    "OAIProtocolError",
    "OAITransportError",
    "OAIHTTPStatusError",
    "Cancelled",
    "OAIDataError",
    "DatestampError",
    "BadArgument",
    "BadResumptionToken",
    "BadVerb",
    "CannotDisseminateFormat",
    "IdDoesNotExist",
    "NoMetadataFormats",
    "NoRecordsMatch",
    "NoSetHierarchy",
    "ERROR_CLASSES",
    "protocol_error",
]


def _where(url: str | None, token: str | None) -> str:
    parts = []
    if url:
        parts.append(url)
    if token:
        parts.append(f"resumptionToken={token!r}")
    return f" ({', '.join(parts)})" if parts else ""


class OAIError(OAIPMHDagsterError):
    """Base of every error raised by the OAI-PMH client."""

    def __init__(self, message: str, *, url: str | None = None, token: str | None = None) -> None:
        self.message = message
        self.url = url
        self.token = token
        super().__init__(message + _where(url, token))


class OAITransportError(OAIError):
    """The request could not be completed (network, timeout, HTTP status, retries)."""


class Cancelled(OAITransportError):
    """The request was cancelled: the caller is stopping (never retried)."""


class OAIHTTPStatusError(OAITransportError):
    """An HTTP error status without an OAI-PMH body (not retried)."""

    def __init__(
        self, message: str, *, status_code: int, url: str | None = None, token: str | None = None
    ) -> None:
        self.status_code = status_code
        super().__init__(message, url=url, token=token)


class OAIDataError(OAIError):
    """The response was received but cannot be used.

    ``retryable`` tells whether asking again may help (a truncated page may
    come back whole; an oversized or unsafe one will not).
    """

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        token: str | None = None,
        retryable: bool = False,
    ) -> None:
        self.retryable = retryable
        super().__init__(message, url=url, token=token)


class DatestampError(OAIDataError, ValueError):
    """A datestamp that cannot be read (also a :class:`ValueError`)."""


class OAIProtocolError(OAIError):
    """The server answered with an OAI-PMH error; ``code`` is its code name.

    ``response_date`` is the server's responseDate of the error response, when read.
    """

    code: str = ""
    response_date: datetime | None = None

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        url: str | None = None,
        token: str | None = None,
    ) -> None:
        if code is not None:
            self.code = code
        self.server_message = message
        text = f"OAI-PMH error {self.code or 'without code'}"
        if message:
            text += f": {message}"
        super().__init__(text, url=url, token=token)


class BadArgument(OAIProtocolError):
    code = "badArgument"


class BadResumptionToken(OAIProtocolError):
    code = "badResumptionToken"


class BadVerb(OAIProtocolError):
    code = "badVerb"


class CannotDisseminateFormat(OAIProtocolError):
    """The metadata format is not offered; ``prefix`` and ``offered`` say more when known."""

    code = "cannotDisseminateFormat"

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        url: str | None = None,
        token: str | None = None,
        prefix: str | None = None,
        offered: list[str] | None = None,
    ) -> None:
        self.prefix = prefix
        self.offered = offered
        details = message
        if prefix is not None:
            details = f"metadataPrefix {prefix!r} is not offered"
            if offered is not None:
                details += f"; the server offers: {', '.join(offered) or '(none)'}"
            if message:
                details += f" (server said: {message})"
        super().__init__(details, code=code, url=url, token=token)
        self.server_message = message


class IdDoesNotExist(OAIProtocolError):
    code = "idDoesNotExist"


class NoMetadataFormats(OAIProtocolError):
    code = "noMetadataFormats"


class NoRecordsMatch(OAIProtocolError):
    code = "noRecordsMatch"


class NoSetHierarchy(OAIProtocolError):
    code = "noSetHierarchy"


ERROR_CLASSES: dict[str, type[OAIProtocolError]] = {
    cls.code: cls
    for cls in (
        BadArgument,
        BadResumptionToken,
        BadVerb,
        CannotDisseminateFormat,
        IdDoesNotExist,
        NoMetadataFormats,
        NoRecordsMatch,
        NoSetHierarchy,
    )
}


def protocol_error(
    code: str, message: str = "", *, url: str | None = None, token: str | None = None
) -> OAIProtocolError:
    """Build the exception for an OAI-PMH error code (unknown codes give a plain OAIProtocolError)."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return OAIProtocolError(message, code=code or "unknown", url=url, token=token)
    return cls(message, url=url, token=token)
