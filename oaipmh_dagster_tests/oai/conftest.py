"""Fixtures of the protocol tests: third-party responses, fake transports, a loopback server."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT.parent / "shared" / "oai-fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.skip(f"third-party OAI-PMH fixtures not found at {FIXTURES}")
    return FIXTURES


def _key(query: str) -> frozenset[tuple[str, str]]:
    return frozenset(parse_qsl(query, keep_blank_values=True))


@pytest.fixture
def sickle_transport(fixtures_dir: Path) -> Callable[..., httpx.MockTransport]:
    """Sickle's sample data: the verb names the file; a resumptionToken is the next file's name."""
    folder = fixtures_dir / "sickle"

    def make(overrides: dict[str, str] | None = None, log: list[dict[str, str]] | None = None):
        def handler(request: httpx.Request) -> httpx.Response:
            params = dict(parse_qsl(request.url.query.decode()))
            if log is not None:
                log.append(params)
            name = params.get("resumptionToken") or f"{params['verb']}.xml"
            name = (overrides or {}).get(params["verb"], name)
            path = folder / name
            if not path.is_file():
                return httpx.Response(404, text="not found")
            return httpx.Response(200, content=path.read_bytes())

        return httpx.MockTransport(handler)

    return make


@pytest.fixture
def pyoai_transport(fixtures_dir: Path) -> Callable[[str], httpx.MockTransport]:
    """pyoai's captures: ``mapping.txt`` maps a query string to a response file."""

    def make(name: str) -> httpx.MockTransport:
        folder = fixtures_dir / "pyoai" / name
        lines = [line.strip() for line in (folder / "mapping.txt").read_text().splitlines()]
        lines = [line for line in lines if line]
        table = {_key(q): folder / f for q, f in zip(lines[::2], lines[1::2], strict=True)}

        def handler(request: httpx.Request) -> httpx.Response:
            path = table.get(_key(request.url.query.decode()))
            if path is None:
                return httpx.Response(404, text="no such capture")
            return httpx.Response(200, content=path.read_bytes())

        return httpx.MockTransport(handler)

    return make


@pytest.fixture
def scythe_transport(fixtures_dir: Path) -> Callable[..., httpx.MockTransport]:
    """oaipmh-scythe's VCR cassettes recorded from Zenodo (status, headers, body)."""
    yaml = pytest.importorskip("yaml")

    def make(*cassettes: str, log: list[httpx.Request] | None = None) -> httpx.MockTransport:
        table: dict[tuple[str, frozenset], httpx.Response] = {}
        for cassette in cassettes:
            data = yaml.safe_load((fixtures_dir / "scythe" / cassette).read_text())
            for item in data["interactions"]:
                parts = urlsplit(item["request"]["uri"])
                response = item["response"]
                headers = {
                    k: v[0]
                    for k, v in response["headers"].items()
                    if k.lower() not in ("content-length", "transfer-encoding", "content-encoding")
                }
                content = (response["body"].get("content") or "").encode()
                table[(parts.netloc, _key(parts.query))] = (response["status"], headers, content)

        def handler(request: httpx.Request) -> httpx.Response:
            if log is not None:
                log.append(request)
            hit = table.get((request.url.netloc.decode(), _key(request.url.query.decode())))
            if hit is None:
                return httpx.Response(404, text="not recorded")
            status, headers, content = hit
            return httpx.Response(status, headers=headers, content=content)

        return httpx.MockTransport(handler)

    return make


class LoopbackServer:
    """A tiny threaded HTTP server on 127.0.0.1; ``handle(handler, params)`` answers."""

    def __init__(
        self, handle: Callable[[http.server.BaseHTTPRequestHandler, dict[str, str]], None]
    ):
        outer = self
        self.requests: list[dict[str, str]] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                params = dict(parse_qsl(urlsplit(self.path).query))
                with outer.lock:
                    outer.requests.append(params)
                    outer.headers.append(dict(self.headers.items()))
                handle(self, params)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/oai"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def send(
    handler: http.server.BaseHTTPRequestHandler,
    body: bytes,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> None:
    """Send a complete response."""
    handler.send_response(status)
    handler.send_header("Content-Type", "text/xml; charset=utf-8")
    handler.send_header("Content-Length", str(len(body)))
    for k, v in (headers or {}).items():
        handler.send_header(k, v)
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def loopback() -> Iterator[Callable[..., LoopbackServer]]:
    servers: list[LoopbackServer] = []

    def start(handle):
        server = LoopbackServer(handle)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
