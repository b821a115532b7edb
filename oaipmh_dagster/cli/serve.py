"""`oaipmh-dagster serve`: the hub's records over OAI-PMH, under uvicorn."""

from __future__ import annotations

import errno
import os
import socket
import sys
from typing import Any

import click

from oaipmh_dagster.storage import db

APP_FACTORY = "oaipmh_dagster.serve.app:app_from_env"


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or one clear error (bad host, port taken)."""
    from oaipmh_dagster.cli.commands import Failure, UsageProblem

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageProblem(f"--host {host!r}: not an address of this machine "
                           f"({getattr(exc, 'strerror', None) or exc})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        why = {errno.EADDRINUSE: "the port is taken",
               errno.EADDRNOTAVAIL: "not an address of this machine",
               errno.EACCES: "permission denied"}.get(exc.errno or 0, exc.strerror or str(exc))
        raise Failure(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port).")
@click.option("--page-size", type=click.IntRange(1, 10_000),
              help="Records, headers or sets per response [default: $OAIPMH_SERVE_PAGE_SIZE "
              "or 500].")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Server processes (each continues any list: tokens are self-contained).")
@click.option("--access-log/--no-access-log", default=True, show_default=True,
              help="Log every request on stderr.")
def serve(host: str, port: int, page_size: int | None, workers: int, access_log: bool) -> None:
    """Serve the stored records as an OAI-PMH 2.0 data provider at /oai.

    Each harvester is a set; identifiers are oai:<hub>:<harvester id>:<source
    identifier>; datestamps are the hub's change times. Configured by $OAIPMH_SERVE_*
    (docs/serve.md); the database is $OAIPMH_DATABASE_URL."""
    import uvicorn

    from oaipmh_dagster.cli.commands import Failure, UsageProblem
    from oaipmh_dagster.serve import BadSetting, Settings, create_app

    try:
        settings = Settings.from_env(page_size=page_size)
    except BadSetting as exc:
        raise UsageProblem(str(exc)) from None
    try:
        engine = db.get_engine()
    except db.DatabaseUnavailable as exc:
        raise Failure(str(exc)) from exc
    sock = _listen(host, port)
    bound = sock.getsockname()
    url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}/oai"
    click.echo(f"serving {db.redact(str(engine.url))} over OAI-PMH at {url} "
               f"({settings.page_size} per page)", err=True)
    if settings.admin_email == Settings.admin_email:
        click.echo("note: $OAIPMH_SERVE_ADMIN_EMAIL is not set: Identify says "
                   f"{Settings.admin_email}", err=True)
    common: dict[str, Any] = {"log_level": "info", "access_log": access_log, "proxy_headers": True,
              "server_header": False}
    if workers > 1:
        if page_size is not None:
            os.environ["OAIPMH_SERVE_PAGE_SIZE"] = str(page_size)
        uvicorn.run(APP_FACTORY, factory=True, workers=workers, fd=sock.fileno(), **common)
        return
    config = uvicorn.Config(create_app(engine, settings), **common)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if not server.started:
        sys.exit(1)
