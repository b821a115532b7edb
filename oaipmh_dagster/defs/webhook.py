"""One JSON POST to a webhook within a total deadline, whatever the receiver does (answer
slowly, trickle a byte every few seconds, never answer): the post runs in a worker thread;
at the deadline its sockets are shut down, which ends a read blocked in that thread. No
Dagster here, and nothing of the webhook's URL but its origin is ever put into words: its
user info, path and query are where webhooks keep their secrets."""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httpx

__all__ = ["Delivery", "origin", "post_json", "proxy_for"]

# After the deadline has shut its sockets, the worker is given this long to end.
_GRACE = 1.0
_CONNECTION_EVENTS = frozenset({"connection.connect_tcp.complete",
                                "connection.start_tls.complete"})


@dataclass(frozen=True)
class Delivery:
    """The outcome of one post: delivered or not, and why, in words without secrets."""

    ok: bool
    reason: str


def origin(url: str) -> str:
    """`scheme://host[:port]` of `url`, the only part of a webhook's URL fit for messages."""
    try:
        u = httpx.URL(url)
    except Exception:  # noqa: BLE001 - an unparseable URL is named, never shown
        return "<unparseable webhook URL>"
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}" if u.host else "<webhook URL without a host>"


class _Sockets:
    """The sockets a post opened, named by httpcore's `trace` request extension, so that
    the deadline can shut them from another thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.closed = False

    def trace(self, event: str, info: dict[str, Any]) -> None:
        stream = info.get("return_value") if event in _CONNECTION_EVENTS else None
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self.lock:
            self.sockets.append(sock)
            late = self.closed
        if late:
            _shut(sock)

    def shut(self) -> None:
        with self.lock:
            self.closed = True
            sockets = list(self.sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)  # wakes a recv() blocked in another thread


def _request(url: str, payload: dict[str, Any], deadline: float,
             sockets: _Sockets) -> httpx.Request:
    """The POST; user info goes into an Authorization header, not the request."""
    u = httpx.URL(url)
    headers = {"User-Agent": "oaipmh-dagster alerts"}
    if u.userinfo:
        pair = f"{unquote(u.username)}:{unquote(u.password)}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        u = u.copy_with(username=None, password=None)
    timeout = {"connect": deadline, "read": deadline, "write": deadline, "pool": deadline}
    return httpx.Request("POST", u, json=payload, headers=headers,
                         extensions={"timeout": timeout, "trace": sockets.trace})


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for `url` (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`,
    minus `NO_PROXY`), as a client would use: the transport alone reads none."""
    u = httpx.URL(url)
    if not u.host or urllib.request.proxy_bypass(u.host):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(u.scheme) or proxies.get("all")


def _post(url: str, payload: dict[str, Any], deadline: float, sockets: _Sockets) -> Delivery:
    """The post itself (the worker's part). The transport is used without a client: a
    client logs each request's whole URL. The answer's body is never read."""
    try:
        request = _request(url, payload, deadline, sockets)
        with httpx.HTTPTransport(retries=0, proxy=proxy_for(url)) as transport:
            response = transport.handle_request(request)
            response.close()
    except Exception as exc:  # noqa: BLE001 - only the kind: messages may quote the URL
        return Delivery(False, type(exc).__name__)
    if 200 <= response.status_code < 300:
        return Delivery(True, f"HTTP {response.status_code}")
    return Delivery(False, f"HTTP {response.status_code}")


def post_json(url: str, payload: dict[str, Any], deadline: float) -> Delivery:
    """POST `payload` to `url`; back within `deadline` seconds (plus a short grace for the
    worker to end once its connection is shut), whatever the receiver does."""
    sockets = _Sockets()
    outcome: list[Delivery] = []
    worker = threading.Thread(target=lambda: outcome.append(_post(url, payload, deadline,
                                                                  sockets)),
                              name="oaipmh-alert-post", daemon=True)
    worker.start()
    worker.join(deadline)
    late = worker.is_alive()
    if late:
        sockets.shut()
        worker.join(_GRACE)  # a worker still resolving the host's name is left behind
    if outcome and (outcome[0].ok or not late):
        return outcome[0]
    return Delivery(False, f"no complete answer within {deadline:g} s")
