"""Pre-rendered OAI-PMH pages and a fast loopback server for the benchmarks.

Every record of a demo data set (`make_dataset`) is rendered to bytes once, at start-up:
its `<header>` and its `<record>` element in one metadata format. A request is then
answered by joining pre-rendered fragments, so the server costs little next to the
client being measured. Argument validation, `from`/`until` parsing, envelopes, errors and
resumption tokens come from the demo server's protocol core
(`oaipmh_dagster.demo.protocol`); this module only swaps in the pre-rendered record store.
The server honours `from`/`until` (both granularities), `set` (with hierarchy), resumption
tokens (stateless, offset based: the data never changes), an optional latency per request
(slept outside any lock, so concurrent requests overlap), and counts requests and the peak
of concurrent list requests.

It runs in its own process (`ServerProcess`), so it never competes with the measured
client for the GIL:

    python -m benchmarks.pages --records 20000 --page-size 100 --latency 0.1

prints `READY <base url>` and then answers `stats` / `reset` lines on stdin until EOF.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

from oaipmh_dagster.demo import protocol as oai
from oaipmh_dagster.demo.dataset import DAY, Dataset, make_dataset

PATH = "/oai"
DAY_SECONDS = 86400
_TAIL = oai.ENVELOPE_TAIL.encode()
VIEW_CACHE = 256
DISTINCT_METADATA = 50_000


def dataset_for(records: int, seed: int = 7) -> Dataset:
    """The data set every case uses: seconds granularity, 4 sets (with hierarchy), 5%
    tombstones, deterministic for the same arguments."""
    return make_dataset(records, seed=seed, sets=4, deleted_ratio=0.05)


def _utc(ts: int) -> str:
    return oai.format_seconds(datetime.fromtimestamp(ts, UTC))


def _timestamp(value: date | datetime | None, *, end: bool) -> int | None:
    """A parsed `from`/`until` as a POSIX timestamp (a day's last second for `until`)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp())
    start = int(datetime(value.year, value.month, value.day, tzinfo=UTC).timestamp())
    return start + DAY_SECONDS - 1 if end else start


@dataclass
class Corpus:
    """A data set rendered once: parallel lists in (datestamp, identifier) order."""

    prefix: str
    schema: str
    namespace: str
    granularity: str
    repository_name: str
    sets: dict[str, str]
    stamps: list[int] = field(default_factory=list)
    identifiers: list[str] = field(default_factory=list)
    memberships: list[tuple[str, ...]] = field(default_factory=list)
    headers: list[bytes] = field(default_factory=list)
    records: list[bytes] = field(default_factory=list)

    @classmethod
    def render(cls, dataset: Dataset, prefix: str = "oai_dc",
               distinct: int = DISTINCT_METADATA) -> Corpus:
        """Render every record; metadata is rendered for the first `distinct` live records
        only and reused cyclically after that (headers stay unique), which keeps start-up
        of large servers short with the same page sizes."""
        fmt = next(f for f in dataset.formats if f[0] == prefix)
        corpus = cls(prefix, fmt[1], fmt[2], dataset.granularity, dataset.repository_name,
                     dict(dataset.sets))
        pool: list[str] = []
        live = 0
        for rec in dataset.records:
            stamp = int(rec.datestamp.timestamp())
            header = oai.header_xml(rec, dataset)
            if rec.deleted:
                record = oai.record_xml(rec, header, None)
            elif prefix in rec.metadata:
                if live < distinct:
                    pool.append(rec.metadata[prefix])
                record = oai.record_xml(rec, header, pool[live % distinct])
                live += 1
            else:
                continue
            corpus.stamps.append(stamp)
            corpus.identifiers.append(rec.identifier)
            corpus.memberships.append(tuple(rec.sets))
            corpus.headers.append(header.encode())
            corpus.records.append(record.encode())
        return corpus

    def __len__(self) -> int:
        return len(self.stamps)


class Responder:
    """Answers OAI-PMH requests from a `Corpus` (no I/O)."""

    def __init__(self, corpus: Corpus, page_size: int, base_url: str = "") -> None:
        self.corpus = corpus
        self.page_size = page_size
        self.base_url = base_url
        self._by_id = {ident: i for i, ident in enumerate(corpus.identifiers)}
        self._set_index: dict[str, tuple[list[int], list[int]]] = {}
        self._views: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        self._tokens = oai.TokenCodec()

    # -- selection ---------------------------------------------------------------------

    def _members(self, spec: str) -> tuple[list[int], list[int]]:
        with self._lock:
            hit = self._set_index.get(spec)
            if hit is None:
                below = spec + ":"
                idx = [i for i, specs in enumerate(self.corpus.memberships)
                       if any(s == spec or s.startswith(below) for s in specs)]
                hit = self._set_index[spec] = (idx, [self.corpus.stamps[i] for i in idx])
            return hit

    def view(self, set_spec: str | None, from_: str | None, until: str | None) -> Any:
        """Indices of the selected records, in list order (a range or a list)."""
        first, last = oai.parse_range(from_, until, self.corpus.granularity)
        low, high = _timestamp(first, end=False), _timestamp(last, end=True)
        key = (set_spec, low, high)
        hit = self._views.get(key)
        if hit is not None:
            return hit
        if set_spec is None:
            stamps = self.corpus.stamps
            start = 0 if low is None else bisect.bisect_left(stamps, low)
            stop = len(stamps) if high is None else bisect.bisect_right(stamps, high)
            result: Any = range(start, max(start, stop))
        else:
            if set_spec not in self.corpus.sets:
                result = range(0)
            else:
                idx, stamps = self._members(set_spec)
                start = 0 if low is None else bisect.bisect_left(stamps, low)
                stop = len(stamps) if high is None else bisect.bisect_right(stamps, high)
                result = idx[start:stop]
        with self._lock:
            if len(self._views) >= VIEW_CACHE:
                self._views.clear()
            self._views[key] = result
        return result

    # -- verbs -------------------------------------------------------------------------

    def envelope(self, attrs: dict[str, str], inner: list[bytes]) -> bytes:
        head = oai.envelope_head(attrs, self.base_url, datetime.now(UTC)).encode()
        return b"".join([head, *inner, _TAIL])

    def answer(self, params: dict[str, list[str]]) -> tuple[str, bytes]:
        """(verb, body) of a request."""
        verb, args = "", dict[str, str]()
        try:
            verb, args = oai.parse_arguments(params)
            inner = getattr(self, f"verb_{verb}")(args)
            attrs = oai.request_attrs(None, verb, args)
        except oai.OAIError as error:
            inner, attrs = [oai.error_element(error).encode()], oai.request_attrs(error, verb, args)
        return verb, self.envelope(attrs, inner)

    def verb_Identify(self, args: dict[str, str]) -> list[bytes]:  # noqa: N802
        c = self.corpus
        earliest = _utc(c.stamps[0]) if c.stamps else "1970-01-01T00:00:00Z"
        if c.granularity == DAY:
            earliest = earliest[:10]
        return [(f"<Identify><repositoryName>{escape(c.repository_name)}</repositoryName>"
                 f"<baseURL>{escape(self.base_url)}</baseURL><protocolVersion>2.0"
                 f"</protocolVersion><adminEmail>bench@example.org</adminEmail>"
                 f"<earliestDatestamp>{earliest}</earliestDatestamp><deletedRecord>persistent"
                 f"</deletedRecord><granularity>{c.granularity}</granularity></Identify>"
                 ).encode()]

    def verb_ListMetadataFormats(self, args: dict[str, str]) -> list[bytes]:  # noqa: N802
        c = self.corpus
        return [(f"<ListMetadataFormats><metadataFormat><metadataPrefix>{c.prefix}"
                 f"</metadataPrefix><schema>{c.schema}</schema><metadataNamespace>"
                 f"{c.namespace}</metadataNamespace></metadataFormat></ListMetadataFormats>"
                 ).encode()]

    def verb_ListSets(self, args: dict[str, str]) -> list[bytes]:  # noqa: N802
        if not self.corpus.sets:
            raise oai.OAIError("noSetHierarchy", "no sets")
        items = "".join(f"<set><setSpec>{escape(s)}</setSpec><setName>{escape(n)}</setName></set>"
                        for s, n in self.corpus.sets.items())
        return [f"<ListSets>{items}</ListSets>".encode()]

    def verb_GetRecord(self, args: dict[str, str]) -> list[bytes]:  # noqa: N802
        if args.get("metadataPrefix") != self.corpus.prefix:
            raise oai.OAIError("cannotDisseminateFormat", "unsupported metadataPrefix")
        i = self._by_id.get(args.get("identifier", ""))
        if i is None:
            raise oai.OAIError("idDoesNotExist", "no such item")
        return [b"<GetRecord>", self.corpus.records[i], b"</GetRecord>"]

    def verb_ListRecords(self, args: dict[str, str]) -> list[bytes]:  # noqa: N802
        return self._list("ListRecords", args, self.corpus.records)

    def verb_ListIdentifiers(self, args: dict[str, str]) -> list[bytes]:  # noqa: N802
        return self._list("ListIdentifiers", args, self.corpus.headers)

    def _list(self, verb: str, args: dict[str, str], items: list[bytes]) -> list[bytes]:
        token = args.get("resumptionToken")
        if token is not None:
            state = self._tokens.decode(token)
            if state is None or state.verb != verb:
                raise oai.OAIError("badResumptionToken", "unreadable token")
            prefix, set_spec, from_, until = state.prefix, state.set_spec, state.from_, state.until
            offset, page = state.cursor, state.page
        else:
            prefix = args["metadataPrefix"]
            set_spec, from_, until = args.get("set"), args.get("from"), args.get("until")
            offset, page = 0, 1
        if prefix != self.corpus.prefix:
            raise oai.OAIError("cannotDisseminateFormat", f"unsupported metadataPrefix {prefix!r}")
        view = self.view(set_spec, from_, until)
        if not view and token is None:
            raise oai.OAIError("noRecordsMatch", "no records match")
        chunk = view[offset:offset + self.page_size]
        end = offset + len(chunk)
        value = None
        if end < len(view):
            nxt = oai.ListState(verb, end, page + 1, 0, 0.0, prefix, set_spec, from_, until)
            value = self._tokens.encode(nxt)
        element = oai.token_element(value, size=len(view), cursor=offset, resumed=token is not None)
        return [f"<{verb}>".encode(), *[items[i] for i in chunk],
                f"{element}</{verb}>".encode()]


class Counters:
    """Requests seen and the peak of list requests in flight at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.list_requests = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def as_dict(self) -> dict[str, int]:
        with self.lock:
            return {"requests": self.requests, "list_requests": self.list_requests,
                    "max_concurrency": self.max_in_flight}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self) -> None:  # noqa: N802
        split = urlsplit(self.path)
        self._serve(split.path, split.query)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        self._serve(urlsplit(self.path).path, body)

    def _serve(self, path: str, query: str) -> None:
        srv = self.server
        if path != PATH:
            self._write(404, b"not found\n", "text/plain")
            return
        params = parse_qs(query, keep_blank_values=True)
        listing = (params.get("verb") or [""])[0] in ("ListRecords", "ListIdentifiers")
        c = srv.counters
        with c.lock:
            c.requests += 1
            if listing:
                c.list_requests += 1
                c.in_flight += 1
                c.max_in_flight = max(c.max_in_flight, c.in_flight)
        try:
            if srv.latency > 0:
                time.sleep(srv.latency)
            _, body = srv.responder.answer(params)
            self._write(200, body, "text/xml; charset=utf-8")
        finally:
            if listing:
                with c.lock:
                    c.in_flight -= 1

    def _write(self, status: int, body: bytes, content_type: str) -> None:
        reason = "OK" if status == 200 else "Not Found"
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.wfile.write(head + body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, responder: Responder, latency: float) -> None:
        self.responder = responder
        self.latency = latency
        self.counters = Counters()
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:  # no reverse DNS lookup
        import socketserver

        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


def serve(records: int, seed: int, prefix: str, page_size: int, latency: float) -> int:
    """Run the server in this process (the `ServerProcess` child)."""
    started = time.perf_counter()
    corpus = Corpus.render(dataset_for(records, seed), prefix)
    responder = Responder(corpus, page_size)
    server = _Server(responder, latency)
    responder.base_url = f"http://127.0.0.1:{server.server_port}{PATH}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    rendered = time.perf_counter() - started
    print(f"READY {responder.base_url} {len(corpus)} {rendered:.2f}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "stats":
            print(json.dumps(server.counters.as_dict()), flush=True)
        elif command == "reset":
            with server.counters.lock:
                server.counters.reset()
            print("{}", flush=True)
        elif command == "quit":
            break
    server.shutdown()
    server.server_close()
    return 0


class ServerProcess:
    """The benchmark server in a subprocess of its own (its own process group)."""

    def __init__(self, records: int, *, page_size: int = 100, latency: float = 0.0,
                 prefix: str = "oai_dc", seed: int = 7, timeout: float = 300.0) -> None:
        self.args = [sys.executable, "-m", "benchmarks.pages", "--records", str(records),
                     "--page-size", str(page_size), "--latency", str(latency),
                     "--prefix", prefix, "--seed", str(seed)]
        self.timeout = timeout
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.records = 0
        self.render_seconds = 0.0

    def __enter__(self) -> ServerProcess:
        root = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen(self.args, cwd=root, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self._readline()
        if not line.startswith("READY "):
            self.close()
            raise RuntimeError(f"benchmark server did not start: {line!r}")
        _, self.url, records, seconds = line.split()
        self.records, self.render_seconds = int(records), float(seconds)
        return self

    def _readline(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.timeout)
        if not result:
            self.close()
            raise RuntimeError("benchmark server did not answer in time")
        return result[0].strip()

    def command(self, text: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return json.loads(self._readline() or "{}")

    def stats(self) -> dict[str, Any]:
        return self.command("stats")

    def reset(self) -> None:
        self.command("reset")

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prefix", default="oai_dc")
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args(argv)
    return serve(args.records, args.seed, args.prefix, args.page_size, args.latency)


if __name__ == "__main__":
    sys.exit(main())
