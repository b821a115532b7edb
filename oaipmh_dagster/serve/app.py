"""The ASGI application: `/oai` answers GET and POST (form-encoded) OAI-PMH requests.

Responses are page-limited (`Settings.page_size`), so a request's memory does not grow
with the store. A database failure is an HTTP 503 with one line of text, never a
traceback; everything a client can get wrong is an OAI-PMH error response."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from urllib.parse import parse_qsl

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from oaipmh_dagster.serve.settings import Settings
from oaipmh_dagster.serve.verbs import CACHE_SECONDS, Provider

log = logging.getLogger("oaipmh_dagster.serve")

# PostgreSQL locks every partition (and its indexes) that a query reads: a list over
# every harvester takes about five locks per harvester, and a server whose lock table
# is too small for that answers "out of shared memory" (docs/storage.md).
LOCKS_HINT = "max_locks_per_transaction"
OUT_OF_LOCKS = ("the hub's database ran out of lock slots: a list over every harvester "
                "locks each harvester's partition and its indexes (about 5 locks a "
                "harvester); raise PostgreSQL's max_locks_per_transaction "
                "(docs/storage.md, 'Thousands of harvesters')")
PATH = "/oai"
XML = "text/xml; charset=utf-8"
MAX_BODY = 64 * 1024


def _pairs(raw: str) -> list[tuple[str, str]]:
    return parse_qsl(raw, keep_blank_values=True, errors="replace", max_num_fields=100)


def create_app(engine: Engine, settings: Settings, *, cache_seconds: float = CACHE_SECONDS,
               clock: Callable[[], datetime] | None = None) -> Starlette:
    """The data provider over `engine`'s registry and record store (`clock`: the
    response time, whole seconds in UTC; tests set it)."""
    provider = Provider(engine, settings, cache_seconds=cache_seconds,
                        **({"clock": clock} if clock else {}))

    async def oai(request: Request) -> Response:
        try:
            if request.method == "POST":
                body = await request.body()
                if len(body) > MAX_BODY:
                    return PlainTextResponse("request body too large", status_code=413)
                raw = body.decode("utf-8", "replace")
            else:
                raw = request.url.query
            pairs = _pairs(raw)
        except ValueError:  # more fields than max_num_fields
            pairs = [("verb", "")]
        base_url = settings.base_url or str(request.url.replace(query="", fragment=""))
        try:
            xml = await run_in_threadpool(provider.respond, pairs, base_url)
        except sa.exc.SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip()
            log.error("database error answering %s: %s", request.url.query[:200],
                      reason.splitlines()[0])
            text = "the hub's database is unavailable; try again later"
            if LOCKS_HINT in reason:
                log.error(OUT_OF_LOCKS)
                text = OUT_OF_LOCKS
            return PlainTextResponse(text, status_code=503, headers={"Retry-After": "30"})
        return Response(xml.encode("utf-8"), media_type=XML)

    app = Starlette(routes=[Route(PATH, oai, methods=["GET", "POST"])])
    app.state.provider = provider
    return app


def app_from_env() -> Starlette:
    """The application of `$OAIPMH_DATABASE_URL` and `$OAIPMH_SERVE_*` (uvicorn's
    factory for several worker processes)."""
    from oaipmh_dagster.storage import db

    return create_app(db.get_engine(), Settings.from_env())
