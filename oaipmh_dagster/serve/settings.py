"""What the data provider says about itself and how it pages, from `OAIPMH_SERVE_*`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from oaipmh_dagster.errors import OAIPMHDagsterError

ENV_PREFIX = "OAIPMH_SERVE_"
# OAI-PMH 2.0 schema's emailType.
EMAIL_PATTERN = re.compile(r"^\S+@(\S+\.)+\S+$")
# The hub's part of its identifiers (`oai:<hub>:<harvester>:<source identifier>`): no colon.
HUB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,99}$")
MAX_PAGE_SIZE = 10_000


class BadSetting(OAIPMHDagsterError, ValueError):
    """An `OAIPMH_SERVE_*` variable (or the option that stands for it) is invalid."""


@dataclass(frozen=True)
class Settings:
    """The data provider's configuration.

    `base_url` None: the URL each request came to (set it behind a proxy); `page_size`:
    records, headers or sets per response; `token_secret`: the key resumption tokens are
    signed with (every server process of one hub needs the same)."""

    repository_name: str = "oaipmh-dagster hub"
    admin_email: str = "admin@example.org"
    base_url: str | None = None
    hub_name: str = "hub"
    page_size: int = 500
    token_secret: str = ""

    def __post_init__(self) -> None:
        if not self.repository_name.strip():
            raise BadSetting(f"{ENV_PREFIX}REPOSITORY_NAME: cannot be empty")
        for email in self.admin_emails:
            if not EMAIL_PATTERN.fullmatch(email):
                raise BadSetting(f"{ENV_PREFIX}ADMIN_EMAIL: {email!r} is not an e-mail address")
        if self.base_url is not None:
            parts = urlsplit(self.base_url)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
                raise BadSetting(f"{ENV_PREFIX}BASE_URL: {self.base_url!r} is not an http(s) "
                                 "URL without a query")
        if not HUB_NAME_PATTERN.fullmatch(self.hub_name):
            raise BadSetting(f"{ENV_PREFIX}HUB_NAME: {self.hub_name!r}: use letters, digits, "
                             "dots and hyphens (it becomes part of every identifier)")
        if not 1 <= self.page_size <= MAX_PAGE_SIZE:
            raise BadSetting(f"{ENV_PREFIX}PAGE_SIZE: {self.page_size} is not between 1 and "
                             f"{MAX_PAGE_SIZE}")

    @property
    def admin_emails(self) -> list[str]:
        """The adminEmail values (the variable may list several, comma-separated)."""
        return [e.strip() for e in self.admin_email.split(",") if e.strip()] or [""]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """The settings of `environ` (default: the process's), `overrides` winning."""
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name, "").strip()
            return value or None

        values: dict[str, object] = {}
        for field, name in (("repository_name", "REPOSITORY_NAME"),
                            ("admin_email", "ADMIN_EMAIL"), ("base_url", "BASE_URL"),
                            ("hub_name", "HUB_NAME"), ("token_secret", "TOKEN_SECRET")):
            value = get(name)
            if value is not None:
                values[field] = value
        size = get("PAGE_SIZE")
        if size is not None:
            try:
                values["page_size"] = int(size)
            except ValueError:
                raise BadSetting(f"{ENV_PREFIX}PAGE_SIZE: {size!r} is not a whole number") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
