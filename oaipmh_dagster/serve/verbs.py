"""The six verbs over the record store: `Provider.respond(pairs, base_url)` is one
response's XML, an OAI-PMH error response for any bad request.

Sets: each harvester is a set (setSpec = its id), a source set of its records one below
(`<id>:<source set>`). Identifiers: `oai:<hub>:<harvester id>:<source identifier>`.
Datestamps: the hub's own change time of each record (harvested_at), seconds in UTC.
A list's upper bound is pinned to its first response's time (see docs/serve.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from sqlalchemy.engine import Engine

from oaipmh_dagster.serve import envelope as x
from oaipmh_dagster.serve import queries as q
from oaipmh_dagster.serve.arguments import ProtocolError, parse, window
from oaipmh_dagster.serve.formats import FormatInfo, describe
from oaipmh_dagster.serve.settings import Settings
from oaipmh_dagster.serve.tokens import (
    BadToken,
    ListToken,
    SetsToken,
    decode_list,
    decode_sets,
    encode_list,
    encode_sets,
)
from oaipmh_dagster.storage.registry import SET_SPEC_PATTERN

# Seconds a read of the registry (and of a format's namespace) is reused.
CACHE_SECONDS = 5.0


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class _Cached:
    """A value recomputed at most every `ttl` seconds (shared by the server's threads)."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._lock = threading.Lock()
        self._values: dict[object, tuple[float, object]] = {}

    def get(self, key: object, compute: Callable[[], object]) -> object:
        now = time.monotonic()
        with self._lock:
            hit = self._values.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        value = compute()
        with self._lock:
            self._values[key] = (now, value)
        return value


class Provider:
    """An OAI-PMH 2.0 data provider over one database's registry and record store."""

    def __init__(self, engine: Engine, settings: Settings, *,
                 cache_seconds: float = CACHE_SECONDS, clock: Callable[[], datetime] = _now
                 ) -> None:
        self.engine = engine
        self.settings = settings
        self._cache = _Cached(cache_seconds)
        self._clock = clock
        self._id_prefix = f"oai:{settings.hub_name}:"

    # -- the request --------------------------------------------------------------------

    def respond(self, pairs: Sequence[tuple[str, str]], base_url: str) -> str:
        """The response to a request's arguments (`pairs`, in order)."""
        now = self._clock()
        try:
            verb, args = parse(pairs)
        except ProtocolError as exc:
            return x.open_response(now, base_url, None) + x.error(exc.code, exc.message) + x.CLOSE
        handler = {"Identify": self._identify, "ListMetadataFormats": self._list_metadata_formats,
                   "ListSets": self._list_sets, "GetRecord": self._get_record,
                   "ListIdentifiers": self._list_identifiers,
                   "ListRecords": self._list_records}[verb]
        try:
            body = handler(args, now, base_url)
        except ProtocolError as exc:
            echo = None if exc.code in ("badVerb", "badArgument") else {"verb": verb, **args}
            return x.open_response(now, base_url, echo) + x.error(exc.code, exc.message) + x.CLOSE
        return x.open_response(now, base_url, {"verb": verb, **args}) + body + x.CLOSE

    # -- what the hub holds ---------------------------------------------------------------

    def sources(self) -> list[q.Source]:
        found = self._cache.get("sources", lambda: q.sources(self.engine))
        return found  # type: ignore[return-value]

    def _format(self, prefix: str, harvester_ids: Sequence[str]) -> FormatInfo | None:
        def compute() -> FormatInfo | None:
            return describe(prefix, q.sample_xml(self.engine, harvester_ids))

        found = self._cache.get(("format", prefix, tuple(harvester_ids)), compute)
        return found  # type: ignore[return-value]

    def identifier(self, harvester_id: str, source_identifier: str) -> str:
        return f"{self._id_prefix}{harvester_id}:{source_identifier}"

    def _split(self, identifier: str) -> tuple[q.Source, str]:
        """(harvester, source identifier) of one of the hub's identifiers."""
        rest = identifier.removeprefix(self._id_prefix)
        harvester_id, sep, source_id = rest.partition(":")
        found = next((s for s in self.sources() if s.id == harvester_id), None)
        if rest == identifier or not sep or not source_id or found is None:
            raise ProtocolError("idDoesNotExist",
                                f"{identifier!r} is not an identifier of this hub "
                                f"({self._id_prefix}<harvester id>:<source identifier>)")
        return found, source_id

    @staticmethod
    def _set_specs(row: q.Row) -> list[str]:
        below = [f"{row.harvester_id}:{s}" for s in row.sets]
        return [row.harvester_id, *(s for s in below if SET_SPEC_PATTERN.fullmatch(s))]

    def _header(self, row: q.Row) -> str:
        return x.header(self.identifier(row.harvester_id, row.identifier),
                        x.datestamp(row.harvested_at), self._set_specs(row), row.deleted)

    def _record(self, row: q.Row) -> str:
        body = "" if row.deleted else x.metadata(row.raw_xml)
        return f"<record>{self._header(row)}{body}</record>"

    # -- the verbs ------------------------------------------------------------------------

    def _identify(self, args: dict[str, str], now: datetime, base_url: str) -> str:
        s = self.settings
        earliest = q.earliest(self.engine) or now
        emails = "".join(f"<adminEmail>{x.text(e)}</adminEmail>" for e in s.admin_emails)
        return (f"<Identify><repositoryName>{x.text(s.repository_name)}</repositoryName>"
                f"<baseURL>{x.text(base_url)}</baseURL>"
                f"<protocolVersion>2.0</protocolVersion>{emails}"
                f"<earliestDatestamp>{x.datestamp(earliest)}</earliestDatestamp>"
                "<deletedRecord>persistent</deletedRecord>"
                "<granularity>YYYY-MM-DDThh:mm:ssZ</granularity></Identify>")

    def _list_metadata_formats(self, args: dict[str, str], now: datetime, base_url: str) -> str:
        sources = self.sources()
        found: list[FormatInfo] = []
        if "identifier" in args:
            source, source_id = self._split(args["identifier"])
            row = q.record(self.engine, source.id, source_id)
            if row is None:
                raise ProtocolError("idDoesNotExist", f"no record {args['identifier']!r}")
            info = (describe(source.prefix, row.raw_xml) if row.raw_xml else None) or \
                self._format(source.prefix, [source.id])
            found = [info] if info else []
        else:
            by_prefix: dict[str, list[str]] = {}
            for s in sources:
                by_prefix.setdefault(s.prefix, []).append(s.id)
            found = [f for prefix, ids in sorted(by_prefix.items())
                     if (f := self._format(prefix, ids)) is not None]
        if not found:
            raise ProtocolError("noMetadataFormats", "no metadata format is known for that")
        items = "".join(
            f"<metadataFormat><metadataPrefix>{x.text(f.prefix)}</metadataPrefix>"
            f"<schema>{x.text(f.schema)}</schema>"
            f"<metadataNamespace>{x.text(f.namespace)}</metadataNamespace></metadataFormat>"
            for f in found)
        return f"<ListMetadataFormats>{items}</ListMetadataFormats>"

    def _list_sets(self, args: dict[str, str], now: datetime, base_url: str) -> str:
        specs: list[tuple[str, str]] = []
        for s in self.sources():
            specs.append((s.id, s.name))
            specs.extend((f"{s.id}:{sub}", f"{s.name}: {sub}") for sub in s.sets
                         if SET_SPEC_PATTERN.fullmatch(f"{s.id}:{sub}"))
        specs.sort()
        if "resumptionToken" in args:
            t = self._decode(lambda v: decode_sets(v, self.settings.token_secret),
                             args["resumptionToken"])
            cursor, total = t.cursor, t.total
            rest = [item for item in specs if item[0] > t.after]
        else:
            if not specs:
                raise ProtocolError("noSetHierarchy", "this hub has no harvesters, so no sets")
            cursor, total, rest = 0, len(specs), specs
        size = self.settings.page_size
        shown, more = rest[:size], len(rest) > size
        if not shown:
            raise ProtocolError("badResumptionToken", "the rest of this list is gone")
        items = "".join(f"<set><setSpec>{x.text(spec)}</setSpec>"
                        f"<setName>{x.text(name)}</setName></set>" for spec, name in shown)
        end = ""
        if more or cursor:
            value = encode_sets(SetsToken(shown[-1][0], cursor + len(shown), total),
                                self.settings.token_secret) if more else ""
            end = x.token(value, cursor, total)
        return f"<ListSets>{items}{end}</ListSets>"

    def _get_record(self, args: dict[str, str], now: datetime, base_url: str) -> str:
        source, source_id = self._split(args["identifier"])
        row = q.record(self.engine, source.id, source_id)
        if row is None:
            raise ProtocolError("idDoesNotExist", f"no record {args['identifier']!r}")
        if args["metadataPrefix"] != source.prefix:
            raise ProtocolError("cannotDisseminateFormat",
                                f"{args['identifier']!r} is held in {source.prefix} only")
        return f"<GetRecord>{self._record(row)}</GetRecord>"

    def _list_identifiers(self, args: dict[str, str], now: datetime, base_url: str) -> str:
        return self._list("ListIdentifiers", args, now)

    def _list_records(self, args: dict[str, str], now: datetime, base_url: str) -> str:
        return self._list("ListRecords", args, now)

    # -- lists ----------------------------------------------------------------------------

    @staticmethod
    def _decode(decode: Callable[[str], object], value: str):  # noqa: ANN205 - the token type
        try:
            return decode(value)
        except BadToken as exc:
            raise ProtocolError("badResumptionToken", str(exc)) from None

    def _selection(self, prefix: str, set_spec: str | None, lower: datetime | None,
                   upper: datetime) -> q.Selection | None:
        """The records of a list, None when no harvester holds that prefix."""
        holding = [s for s in self.sources() if s.prefix == prefix]
        if not holding:
            return None
        source_set = None
        if set_spec is not None:
            harvester_id, _, below = set_spec.partition(":")
            holding = [s for s in holding if s.id == harvester_id]
            source_set = below or None
        return q.Selection(tuple(s.id for s in holding), source_set, lower, upper)

    def _list(self, verb: str, args: dict[str, str], now: datetime) -> str:
        secret = self.settings.token_secret
        if "resumptionToken" in args:
            t: ListToken = self._decode(lambda v: decode_list(v, verb, secret),
                                        args["resumptionToken"])
            sel = self._selection(t.prefix, t.set_spec, t.lower, t.upper)
            if sel is None or not sel.ids:
                raise ProtocolError("badResumptionToken",
                                    "the harvesters of this list are no longer registered")
            prefix, set_spec, after, cursor, total = (t.prefix, t.set_spec, t.after,
                                                      t.cursor, t.total)
        else:
            prefix, set_spec = args["metadataPrefix"], args.get("set")
            bounds = window(args)
            upper = now if bounds.upper is None else min(bounds.upper, now)
            if set_spec is not None and not self.sources():
                raise ProtocolError("noSetHierarchy", "this hub has no harvesters, so no sets")
            sel = self._selection(prefix, set_spec, bounds.lower, upper)
            if sel is None:
                raise ProtocolError("cannotDisseminateFormat",
                                    f"no harvester of this hub holds records in {prefix}")
            total = q.count(self.engine, sel) if sel.ids else 0
            if not total:
                raise ProtocolError("noRecordsMatch", "no record matches these arguments")
            after, cursor = None, 0
        size = self.settings.page_size
        rows = q.page(self.engine, sel, after, size + 1, with_raw=verb == "ListRecords")
        shown, more = rows[:size], len(rows) > size
        if not shown:
            raise ProtocolError("noRecordsMatch", "the rest of this list changed since it "
                                "began: harvest again from its first responseDate")
        write = self._header if verb == "ListIdentifiers" else self._record
        items = "".join(write(row) for row in shown)
        end = ""
        if more or cursor:
            value = ""
            if more:
                last = shown[-1]
                value = encode_list(ListToken(verb, prefix, set_spec, sel.lower, sel.upper,
                                              (last.harvested_at, last.harvester_id,
                                               last.identifier), cursor + len(shown), total),
                                    secret)
            end = x.token(value, cursor, total)
        return f"<{verb}>{items}{end}</{verb}>"
