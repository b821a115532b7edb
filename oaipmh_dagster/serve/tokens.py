"""Resumption tokens: self-contained, so any server process continues any list.

A token is base64url(JSON) "." base64url(HMAC-SHA256 of it, 12 bytes). The JSON holds
what the list selects and where the next page starts: for records, the keyset position
(harvested_at in microseconds, harvester id, source identifier) and the list's bounds,
whose upper one was pinned to the first response's time; for sets, the last setSpec.
Nothing expires: a position stays meaningful however long the client waits."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from oaipmh_dagster.errors import OAIPMHDagsterError

_DEFAULT_KEY = b"oaipmh-dagster serve"
_SIG_BYTES = 12
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TOKEN = 8192

LIST_VERBS = {"ListRecords": "R", "ListIdentifiers": "I"}


class BadToken(OAIPMHDagsterError, ValueError):
    """A resumption token that this hub did not issue, or that was altered."""


def micros(value: datetime) -> int:
    """An aware datetime as whole microseconds since the epoch (exact, unlike a float)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


Position = tuple[datetime, str, str]  # harvested_at, harvester id, source identifier


@dataclass(frozen=True)
class ListToken:
    """Where a ListRecords/ListIdentifiers list goes on: `lower` inclusive, `upper`
    exclusive (the smaller of `until` and the list's first response time)."""

    verb: str
    prefix: str
    set_spec: str | None
    lower: datetime | None
    upper: datetime
    after: Position
    cursor: int
    total: int


@dataclass(frozen=True)
class SetsToken:
    """Where a ListSets list goes on: after the setSpec `after`."""

    after: str
    cursor: int
    total: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(body: bytes, secret: str) -> bytes:
    key = secret.encode("utf-8") if secret else _DEFAULT_KEY
    return hmac.new(key, body, hashlib.sha256).digest()[:_SIG_BYTES]


def _seal(payload: dict[str, Any], secret: str) -> str:
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return f"{_b64(body)}.{_b64(_sign(body, secret))}"


def _open(token: str, secret: str) -> dict[str, Any]:
    if len(token) > MAX_TOKEN or token.count(".") != 1:
        raise BadToken("not a resumption token of this hub")
    body_text, sig_text = token.split(".")
    try:
        body, sig = _unb64(body_text), _unb64(sig_text)
    except (binascii.Error, ValueError):
        raise BadToken("not a resumption token of this hub") from None
    if not hmac.compare_digest(sig, _sign(body, secret)):
        raise BadToken("not a resumption token of this hub (or it was altered)")
    try:
        payload = json.loads(body)
    except ValueError:
        raise BadToken("not a resumption token of this hub") from None
    if not isinstance(payload, dict):
        raise BadToken("not a resumption token of this hub")
    return payload


def encode_list(t: ListToken, secret: str) -> str:
    at, harvester, identifier = t.after
    return _seal({"v": LIST_VERBS[t.verb], "m": t.prefix, "s": t.set_spec,
                  "l": None if t.lower is None else micros(t.lower), "u": micros(t.upper),
                  "a": [micros(at), harvester, identifier], "c": t.cursor, "n": t.total},
                 secret)


def decode_list(token: str, verb: str, secret: str) -> ListToken:
    p = _open(token, secret)
    if p.get("v") != LIST_VERBS[verb]:
        raise BadToken(f"this resumption token belongs to another verb than {verb}")
    try:
        at, harvester, identifier = p["a"]
        lower = p["l"]
        out = ListToken(verb=verb, prefix=str(p["m"]),
                        set_spec=None if p["s"] is None else str(p["s"]),
                        lower=None if lower is None else from_micros(int(lower)),
                        upper=from_micros(int(p["u"])),
                        after=(from_micros(int(at)), str(harvester), str(identifier)),
                        cursor=int(p["c"]), total=int(p["n"]))
    except (KeyError, TypeError, ValueError, OverflowError):
        raise BadToken("a resumption token of this hub, but not one this version reads") from None
    if out.cursor < 0 or out.total < 1:
        raise BadToken("a resumption token with an impossible position")
    return out


def encode_sets(t: SetsToken, secret: str) -> str:
    return _seal({"v": "S", "a": t.after, "c": t.cursor, "n": t.total}, secret)


def decode_sets(token: str, secret: str) -> SetsToken:
    p = _open(token, secret)
    if p.get("v") != "S":
        raise BadToken("this resumption token belongs to another verb than ListSets")
    try:
        out = SetsToken(after=str(p["a"]), cursor=int(p["c"]), total=int(p["n"]))
    except (KeyError, TypeError, ValueError):
        raise BadToken("a resumption token of this hub, but not one this version reads") from None
    if out.cursor < 0 or out.total < 1:
        raise BadToken("a resumption token with an impossible position")
    return out
