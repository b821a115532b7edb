"""HTTP behaviour of the client: retries, Retry-After, statuses, size, gzip, credentials."""

from __future__ import annotations

import gzip
import logging
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from oaipmh_dagster.oai import (
    ClientOptions,
    OAIClient,
    OAIDataError,
    OAIHTTPStatusError,
    OAITransportError,
)
from oaipmh_dagster.oai._transport import parse_retry_after

from .helpers import FakeServer, SleepRecorder, error_xml, identify_xml, list_records_xml


def sequence(*replies):
    """A route answering with the given replies in turn (the last one repeats)."""
    items = list(replies)

    def route(params):
        reply = items.pop(0) if len(items) > 1 else items[0]
        if isinstance(reply, Exception):
            raise reply
        return reply

    return route


def make_client(route, options=None, **kwargs):
    server = FakeServer(route)
    sleep = SleepRecorder()
    client = OAIClient(
        "http://oai.test/oai",
        options or ClientOptions(backoff_base=1.0, backoff_max=8.0),
        transport=server.transport(),
        sleep=sleep,
        clock=sleep.clock,
        **kwargs,
    )
    return client, server, sleep


def test_retry_after_seconds_and_cap(caplog):
    route = sequence(
        httpx.Response(503, headers={"Retry-After": "7"}),
        httpx.Response(429, headers={"Retry-After": "100000"}),
        identify_xml(),
    )
    client, server, sleep = make_client(route, ClientOptions(retry_after_max=120.0))
    with caplog.at_level(logging.WARNING):
        assert client.identify().repository_name == "Test"
    assert sleep.waits == [7.0, 120.0]
    assert client.stats.retries == 2
    assert client.stats.requests == 3
    assert "HTTP 503" in caplog.text and "HTTP 429" in caplog.text


def test_retry_after_http_date():
    """The wait is the date less the moment the answer came, however long the call took
    to get there (the date has whole seconds: up to 1 s less)."""
    before = time.time()
    when = datetime.fromtimestamp(before, UTC) + timedelta(seconds=30)
    route = sequence(
        httpx.Response(503, headers={"Retry-After": format_datetime(when, usegmt=True)}),
        identify_xml(),
    )
    client, _, sleep = make_client(route)
    client.identify()
    took = time.time() - before
    assert len(sleep.waits) == 1
    assert 29 - took <= sleep.waits[0] <= 30 + 0.5


def test_parse_retry_after():
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    now = datetime(2015, 10, 21, 7, 27, 0, tzinfo=UTC).timestamp()
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 60.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


@pytest.mark.parametrize("status", [500, 502, 504])
def test_server_errors_retried_with_bounded_backoff(status):
    route = sequence(httpx.Response(status, text="oops"))
    options = ClientOptions(max_retries=6, backoff_base=1.0, backoff_max=8.0)
    client, server, sleep = make_client(route, options)
    with pytest.raises(OAITransportError) as info:
        client.identify()
    assert f"HTTP {status}" in str(info.value)
    assert "gave up after 7 attempts" in str(info.value)
    assert "http://oai.test/oai?verb=Identify" in str(info.value)
    assert len(server.requests) == 7
    assert len(sleep.waits) == 6
    for attempt, wait in enumerate(sleep.waits):
        cap = min(8.0, 2**attempt)
        assert cap / 2 <= wait <= cap


def test_503_without_retry_after_backs_off():
    client, _, sleep = make_client(sequence(httpx.Response(503), identify_xml()))
    client.identify()
    assert 0.5 <= sleep.waits[0] <= 1.0


@pytest.mark.parametrize("status", [400, 401, 403, 404, 410])
def test_client_errors_not_retried(status):
    client, server, sleep = make_client(sequence(httpx.Response(status, text="<html>no</html>")))
    with pytest.raises(OAIHTTPStatusError) as info:
        client.identify()
    assert info.value.status_code == status
    assert f"HTTP {status}" in str(info.value)
    assert len(server.requests) == 1
    assert sleep.waits == []


def test_oai_error_with_http_status_is_a_protocol_error():
    from oaipmh_dagster.oai import BadArgument

    client, server, _ = make_client(
        sequence(httpx.Response(400, content=error_xml("badArgument", "bad from")))
    )
    with pytest.raises(BadArgument, match="bad from"):
        list(client.list_records("oai_dc"))
    assert len(server.requests) == 1


def test_timeouts_retried_then_transport_error():
    def route(params):
        raise httpx.ReadTimeout("slow")

    client, server, sleep = make_client(route, ClientOptions(max_retries=3, backoff_base=0.1))
    with pytest.raises(OAITransportError, match="timeout") as info:
        client.identify()
    assert len(server.requests) == 4
    assert len(sleep.waits) == 3
    assert "gave up after 4 attempts" in str(info.value)


def test_connection_error_recovers():
    client, server, _ = make_client(sequence(httpx.ConnectError("refused"), identify_xml()))
    assert client.identify().repository_name == "Test"
    assert client.stats.retries == 1


def test_timeouts_are_explicit():
    client = OAIClient("http://oai.test/oai", ClientOptions(connect_timeout=3, read_timeout=40))
    assert client._transport._timeout.connect == 3
    assert client._transport._timeout.read == 40
    client.close()


def test_html_page_retried_then_data_error():
    client, server, sleep = make_client(
        sequence(httpx.Response(200, text="<html><body>maintenance</body></html>")),
        ClientOptions(max_retries=2, backoff_base=0.01),
    )
    with pytest.raises(OAIDataError, match="HTML") as info:
        list(client.list_records("oai_dc"))
    assert "gave up after 3 attempts" in str(info.value)
    assert len(server.requests) == 3


def test_truncated_page_recovers():
    whole = list_records_xml(["a", "b", "c"])
    client, _, _ = make_client(sequence(whole[: len(whole) // 2], whole))
    assert len(list(client.list_records("oai_dc"))) == 3
    assert client.stats.retries == 1


def test_gzip_without_content_encoding():
    body = list_records_xml(["a", "b"])
    client, _, _ = make_client(sequence(httpx.Response(200, content=gzip.compress(body))))
    records = list(client.list_records("oai_dc"))
    assert [r.header.identifier for r in records] == ["a", "b"]


def test_gzip_with_content_encoding():
    body = list_records_xml(["a"])
    reply = httpx.Response(200, content=gzip.compress(body), headers={"Content-Encoding": "gzip"})
    client, server, _ = make_client(sequence(reply))
    assert len(list(client.list_records("oai_dc"))) == 1
    assert "gzip" in server.requests[0].headers["accept-encoding"]


def test_response_too_large_streamed():
    body = list_records_xml([f"id{i}" for i in range(200)])
    options = ClientOptions(max_response_bytes=5000)
    chunks_sent = []

    def stream():
        for i in range(0, len(body), 1000):
            chunks_sent.append(i)
            yield body[i : i + 1000]

    client, server, sleep = make_client(sequence(httpx.Response(200, content=stream())), options)
    with pytest.raises(OAIDataError, match="exceeds the maximum of 5000 bytes"):
        list(client.list_records("oai_dc"))
    assert len(server.requests) == 1  # not retried
    assert len(chunks_sent) <= 7  # stopped reading early


def test_declared_length_too_large():
    body = list_records_xml([f"id{i}" for i in range(50)])
    client, _, _ = make_client(sequence(body), ClientOptions(max_response_bytes=1000))
    with pytest.raises(OAIDataError, match="exceeds"):
        list(client.list_records("oai_dc"))


def test_gzip_bomb_without_header_bounded():
    bomb = gzip.compress(b"<" + b" " * 5_000_000)
    client, _, _ = make_client(sequence(bomb), ClientOptions(max_response_bytes=100_000))
    with pytest.raises(OAIDataError, match="decompressed response exceeds"):
        client.identify()


def test_user_agent_and_contact():
    client, server, _ = make_client(
        sequence(identify_xml()),
        ClientOptions(user_agent="harvester/1.0", contact="ops@example.org"),
    )
    client.identify()
    headers = server.requests[0].headers
    assert headers["user-agent"] == "harvester/1.0 (+mailto:ops@example.org)"
    assert headers["from"] == "ops@example.org"
    default = ClientOptions()
    assert default.user_agent.startswith("oaipmh-dagster/")


def test_basic_auth_only_to_base_host_and_never_leaked(caplog):
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        if request.url.host == "oai.test" and "hop" not in request.url.params:
            return httpx.Response(302, headers={"Location": "http://other.test/oai?verb=Identify"})
        if request.url.host == "other.test":
            return httpx.Response(
                302, headers={"Location": "http://oai.test/oai?verb=Identify&hop=1"}
            )
        return httpx.Response(200, content=identify_xml())

    seen: list[tuple[str, str | None]] = []
    options = ClientOptions(auth=("alice", "s3cr3t-pw"))
    assert "s3cr3t" not in repr(options)
    client = OAIClient("http://oai.test/oai", options, transport=httpx.MockTransport(handler))
    with caplog.at_level(logging.DEBUG):
        client.identify()
    assert seen[0][1] and seen[0][1].startswith("Basic ")
    assert seen[1] == ("other.test", None)
    assert seen[2][1] is not None
    assert "s3cr3t" not in caplog.text


def test_bearer_token_and_userinfo_never_in_errors(caplog):
    options = ClientOptions(bearer_token="tok-SECRET", max_retries=1, backoff_base=0.0)
    server = FakeServer(sequence(httpx.Response(500)))
    client = OAIClient(
        "http://oai.test/oai", options, transport=server.transport(), sleep=SleepRecorder()
    )
    with caplog.at_level(logging.DEBUG), pytest.raises(OAITransportError) as info:
        client.identify()
    assert server.requests[0].headers["authorization"] == "Bearer tok-SECRET"
    assert "tok-SECRET" not in str(info.value) and "tok-SECRET" not in caplog.text
    assert "tok-SECRET" not in repr(options)

    server = FakeServer(sequence(httpx.Response(500)))
    client = OAIClient(
        "http://bob:pa55word@oai.test/oai",
        ClientOptions(max_retries=1, backoff_base=0.0),
        transport=server.transport(),
        sleep=SleepRecorder(),
    )
    assert client.base_url == "http://oai.test/oai"
    with caplog.at_level(logging.DEBUG), pytest.raises(OAITransportError) as info:
        client.identify()
    assert "pa55word" not in str(info.value) and "pa55word" not in caplog.text
    assert server.requests[0].headers["authorization"].startswith("Basic ")
    assert "bob" not in str(server.requests[0].url)


def test_base_url_query_is_kept():
    server = FakeServer(sequence(identify_xml()))
    client = OAIClient("http://oai.test/cgi?repo=x", transport=server.transport())
    client.identify()
    assert server.params[0] == {"repo": "x", "verb": "Identify"}


def test_invalid_options():
    with pytest.raises(ValueError):
        ClientOptions(max_parallel=0)
    with pytest.raises(ValueError):
        ClientOptions(auth=("a", "b"), bearer_token="c")
    with pytest.raises(ValueError):
        OAIClient("ftp://x/oai")


def test_truncated_gzip_without_header_is_retried():
    body = gzip.compress(list_records_xml(["a"]))
    client, server, _ = make_client(sequence(body[: len(body) // 2], body))
    assert len(list(client.list_records("oai_dc"))) == 1
    assert len(server.requests) == 2


def test_redirect_loop_is_bounded():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"Location": "/oai?verb=Identify"})

    client = OAIClient(
        "http://oai.test/oai",
        ClientOptions(max_retries=0),
        transport=httpx.MockTransport(handler),
    )
    with pytest.raises(OAITransportError, match="redirects"):
        client.identify()


def test_httpx_request_log_lines_carry_no_credentials(caplog: pytest.LogCaptureFixture) -> None:
    """httpx logs every request's full URL at INFO: the user name, password and the
    values of credential-like query parameters are masked there; the rest stays."""
    import oaipmh_dagster.oai  # noqa: F401 - installs the filter

    transport = httpx.MockTransport(lambda request: httpx.Response(200, text="ok"))
    with caplog.at_level(logging.INFO, logger="httpx"), \
            httpx.Client(transport=transport) as http:
        http.get("https://alice:s3cret@repo.example/oai?verb=Identify&apikey=K3Y&token=T0K")
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert lines, "httpx logged no request line"
    text = "\n".join(lines)
    for secret in ("alice", "s3cret", "K3Y", "T0K"):
        assert secret not in text
    assert "repo.example/oai?verb=Identify" in text and "200" in text
