"""How a client talks to one endpoint: options, the logger protocol, the User-Agent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from oaipmh_dagster import __version__

__all__ = ["DEADLINE_FACTOR", "DEFAULT_USER_AGENT", "ClientOptions", "LoggerLike"]

DEFAULT_USER_AGENT = f"oaipmh-dagster/{__version__}"
DEADLINE_FACTOR = 5
"""A request's default deadline, in multiples of the read timeout."""


class LoggerLike(Protocol):
    """Anything with the usual logging methods (a ``logging.Logger``, Dagster's ``context.log``)."""

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...
    def info(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...
    def warning(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...
    def error(self, msg: str, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class ClientOptions:
    """How a client talks to one endpoint. Times are in seconds."""

    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    """Longest wait for any single read from the server."""
    request_timeout: float | None = None
    """Longest time one HTTP request may take, from connecting to the last byte of the
    body (a server that trickles bytes never trips ``read_timeout``). None means
    ``DEADLINE_FACTOR`` × ``read_timeout``."""
    max_retries: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    retry_after_max: float = 300.0
    delay: float = 0.0
    """Minimum time between the starts of two requests to the same host."""
    max_parallel: int = 1
    """Requests in flight to the same host at once, counted across all clients of the process."""
    user_agent: str = DEFAULT_USER_AGENT
    contact: str | None = None
    """An e-mail address or URL added to the User-Agent (and sent as ``From`` if an e-mail)."""
    max_response_bytes: int = 256 * 1024 * 1024
    max_empty_pages: int = 100
    """Consecutive pages with a resumptionToken but no records accepted before giving up."""
    prefetch: bool = False
    """Fetch page n+1 in a background thread while page n is consumed."""
    auth: tuple[str, str] | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.max_parallel < 1:
            raise ValueError("max_parallel must be at least 1")
        if self.max_retries < 0:
            raise ValueError("max_retries must not be negative")
        if self.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be positive")
        if self.auth is not None and self.bearer_token is not None:
            raise ValueError("give either auth (basic) or bearer_token, not both")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError("request_timeout must be positive")

    @property
    def deadline(self) -> float:
        """Seconds one request may take in total."""
        if self.request_timeout is not None:
            return self.request_timeout
        return DEADLINE_FACTOR * self.read_timeout

    @property
    def full_user_agent(self) -> str:
        if not self.contact:
            return self.user_agent
        contact = self.contact
        if "@" in contact and ":" not in contact:
            contact = f"mailto:{contact}"
        return f"{self.user_agent} (+{contact})"
