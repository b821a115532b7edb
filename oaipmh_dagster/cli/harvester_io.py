"""`oaipmh-dagster harvester import` and `harvester export`: harvesters from and to a
CSV, JSON or YAML file (see `operations.harvester_files` and `operations.bulk`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from oaipmh_dagster.cli.commands import Failure, UsageProblem, _no_database_yet, _registry
from oaipmh_dagster.operations.harvester_files import FORMATS, FileProblem, format_of
from oaipmh_dagster.storage.registry import Harvester
from oaipmh_dagster.words import count

__all__ = ["export_harvesters", "import_harvesters"]

STDIO = "-"


def _format(path: str, fmt: str | None, option: str) -> str:
    """`fmt`, else the one `path`'s extension names; a usage error when neither does."""
    if fmt is not None:
        return fmt
    if path == STDIO:
        raise UsageProblem(f"{'stdin' if option == 'FILE' else 'stdout'} has no extension: "
                           f"pass --format {'|'.join(FORMATS)}")
    found = format_of(path)
    if found is None:
        raise UsageProblem(f"cannot tell the format of {path} from its extension (.csv, "
                           f".json, .yaml or .yml): pass --format {'|'.join(FORMATS)}")
    return found


def _read(path: str) -> str:
    try:
        if path == STDIO:
            data = sys.stdin.buffer.read() if sys.stdin is not None else b""
        else:
            data = Path(path).read_bytes()
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageProblem(f"cannot read {path}: not UTF-8 text ({exc.reason} at byte "
                           f"{exc.start})") from None
    except OSError as exc:
        raise UsageProblem(f"cannot read {path}: {exc.strerror or exc}") from None


class _Progress:
    """Probe progress on stderr: one line rewritten on a terminal, else a line per
    tenth and the last."""

    def __init__(self) -> None:
        try:
            self.tty = sys.stderr.isatty()
        except (AttributeError, ValueError):
            self.tty = False

    def __call__(self, done: int, total: int) -> None:
        text = f"probed {done}/{total} endpoint{'s' if total != 1 else ''}"
        if self.tty:
            click.echo(f"\r{text}", err=True, nl=done == total)
        elif done == total or done % max(1, total // 10) == 0:
            click.echo(text, err=True)


def import_harvesters(path: str, fmt: str | None, *, update: bool, check: bool,
                      skip_invalid: bool) -> None:
    """Read, validate and probe every row, then write them in one transaction (or
    refuse the file: one line per bad row on stderr, nothing written)."""
    from oaipmh_dagster.operations.admin import AdminError
    from oaipmh_dagster.operations.bulk import plan_import, write_import
    from oaipmh_dagster.operations.harvester_files import read_rows

    fmt = _format(path, fmt, "FILE")
    shown = "stdin" if path == STDIO else path
    try:
        rows = read_rows(_read(path), fmt)
    except FileProblem as exc:
        raise UsageProblem(f"{shown}: {exc}") from None
    registry = _registry()
    plan = plan_import(registry, rows, update=update, check=check, progress=_Progress())
    for bad in plan.bad:
        click.echo(f"{'skipped ' if skip_invalid else ''}{shown}: {bad}", err=True)
    if plan.bad and not skip_invalid:
        raise (UsageProblem if plan.usage else Failure)(
            f"{shown}: {len(plan.bad)} of {count(plan.rows, 'row')} refused, nothing "
            "written (--skip-invalid writes the valid rows)")
    try:
        done = write_import(registry, plan)
    except AdminError as exc:
        raise Failure(str(exc)) from exc
    for line in done.lines:
        click.echo(f"note: {line.text}" if line.note else line.text, err=line.note)
    click.echo(f"{shown}: {len(done.added)} added, {len(done.updated)} updated, "
               f"{len(plan.unchanged)} unchanged, {len(plan.bad)} skipped")


def export_harvesters(fmt: str | None, output: str) -> None:
    """Write every harvester, ordered by id, in a format `harvester import` reads back."""
    from oaipmh_dagster.operations.export import BadDestination, Destination, ExportError
    from oaipmh_dagster.operations.harvester_files import dump

    fmt = _format(output, fmt, "OUTPUT") if output != STDIO or fmt else "json"
    try:
        to = Destination.resolve(output, fmt)
    except BadDestination as exc:
        raise UsageProblem(str(exc)) from exc
    except ExportError as exc:
        raise Failure(str(exc)) from exc
    rows = [] if _no_database_yet() else _registry().list_rows()
    harvesters = [r for r in rows if isinstance(r, Harvester)]
    for r in rows:
        if not isinstance(r, Harvester):
            click.echo(f"note: harvester {r.id} left out: stored with an invalid value "
                       f"({r.error})", err=True)
    text = dump(harvesters, fmt)
    with to.open() as fh:
        fh.write(text.encode("utf-8"))
    click.echo(f"wrote {count(len(harvesters), 'harvester')} to "
               f"{'stdout' if to.path is None else output}",
               err=to.path is None)
