"""The CLI's `harvest`: run a harvester's job in this process on a Dagster instance and
show its progress and outcome."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import dagster as dg

from oaipmh_dagster.defs._private import execute_in_location
from oaipmh_dagster.defs.assets import op_name
from oaipmh_dagster.defs.listener import LISTENER_KEY, listener_resource
from oaipmh_dagster.harvesting.harvest import HarvestStats, Listener, Progress
from oaipmh_dagster.storage.registry import Registry


def _listener(finals: list[HarvestStats], stream: TextIO | None = None) -> Listener:
    """A progress line on `stream` (default: stderr) that collects the final statistics."""
    out: TextIO = stream or sys.stderr  # the current one, not the one at import time
    interactive = out.isatty()

    def finish(stats: HarvestStats) -> None:
        finals.append(stats)
        if interactive:
            out.write("\r\033[K")

    def retry(line: str) -> None:
        out.write(("\r\033[K" if interactive else "") + line + "\n")
        out.flush()

    return Listener(on_page=_page_printer(out, interactive), on_finish=finish, on_retry=retry)


def _page_printer(stream: TextIO, interactive: bool) -> Callable[[Progress], None]:
    """One line per page on a terminal (rewritten in place), else one every 5 s."""
    last = [0.0]

    def show(event: Progress) -> None:
        now = time.monotonic()
        if interactive or now - last[0] >= 5 or event.token is None:
            last[0] = now
            total = f"/{event.complete_list_size}" if event.complete_list_size else ""
            noun = "record" if event.records == 1 and not total else "records"
            line = (f"page {event.pages}: {event.records}{total} {noun}, "
                    f"{event.rate:.0f} records/s")
            stream.write(("\r\033[K" + line) if interactive else line + "\n")
            stream.flush()

    return show


def _root_cause(error: Any) -> str:
    """The innermost error's first line (not Dagster's wrapper), its class unqualified."""
    while getattr(error, "cause", None) is not None:
        error = error.cause
    line = (error.message.strip().splitlines() or [error.cls_name or "unknown error"])[0]
    qualified, sep, rest = line.partition(": ")
    if sep and error.cls_name and qualified.endswith("." + error.cls_name):
        line = f"{error.cls_name}: {rest}"
    return line


_INTERRUPTS = frozenset({"DagsterExecutionInterruptedError", "KeyboardInterrupt"})


def _interrupted(error: Any) -> bool:
    """Whether a step failed because the process was interrupted (SIGINT, SIGTERM)."""
    while error is not None:
        if getattr(error, "cls_name", None) in _INTERRUPTS:
            return True
        error = getattr(error, "cause", None)
    return False


@contextmanager
def _sigterm_as_sigint() -> Iterator[None]:
    """SIGTERM stops the harvest as Ctrl-C does. Dagster maps SIGTERM to its interrupt
    handler only while the run executes; before and after, it would kill the process
    without a word."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_harvest_job(
    instance: dg.DagsterInstance, harvester_id: str, config: dict[str, Any],
    registry: Registry | None = None, verbose: bool = False, location: str | None = None,
    on_summary: Callable[[str], None] | None = None,
) -> tuple[bool, str]:
    """Execute `harvest_oaipmh_records_<id>` in-process; returns (success, summary line).
    With `location` (the code location that holds the harvester) the run belongs to that
    location's job as a launch from the UI does (the job's Runs tab lists it).

    Dagster's console log (with the traceback of a failure) reaches stderr only when
    `verbose`; the run's event log always has it. A run that failed because a sweep was
    held back harvested all the same: `on_summary` gets its summary line, and the
    failure line is what was held back."""
    from oaipmh_dagster.definitions import build_definitions

    registry = registry or Registry()
    h = registry.get(harvester_id)
    defs = build_definitions([h])
    job = defs.resolve_job_def(h.job_name)
    finals: list[HarvestStats] = []
    run_config = {
        "ops": {op_name(h.id): {"config": config}},
        "loggers": {"console": {"config": {"log_level": "INFO" if verbose else "CRITICAL"}}},
    }
    with _sigterm_as_sigint():
        run_args: dict[str, Any] = {
            "run_config": run_config, "raise_on_error": False,
            "resources": {LISTENER_KEY: listener_resource(_listener(finals))}}
        result = (execute_in_location(job, location, instance, **run_args) if location
                  else job.execute_in_process(instance=instance, **run_args))
    if not result.success:
        failures = [
            error for ev in result.all_events
            if ev.is_step_failure
            and (error := getattr(ev.event_specific_data, "error", None)) is not None
        ]
        held = finals[-1].held_back if finals else None
        if held is not None:
            if on_summary is not None:
                on_summary(f"run {result.run_id}: {finals[-1].summary()}")
            return False, f"run {result.run_id} failed: {held.message()}"
        if any(_interrupted(error) for error in failures):
            return False, (f"run {result.run_id} interrupted: the harvest stopped; the pages "
                           "stored so far are kept, and the same harvest run again resumes "
                           "after them")
        errors = [_root_cause(error) for error in failures]
        detail = errors[0] if errors else "see the run's logs"
        return False, f"run {result.run_id} failed: {detail}"
    summary = finals[-1].summary() if finals else "records re-transformed"
    return True, f"run {result.run_id} succeeded. {summary}"
