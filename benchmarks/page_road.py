"""The road of one page: how many calls and module crossings inside `oaipmh_dagster` one
ListRecords page costs on its way from the request to the committed row.

A harvest of N one-record pages and one of N+1 pages are profiled (every thread, with
`sys.setprofile`/`threading.setprofile`, counting only frames of `oaipmh_dagster`
outside `demo/`); the difference is one page's road. A generator resumed counts as a
call, as the interpreter reports it. A crossing is a call whose nearest calling
`oaipmh_dagster` frame is in another module; a callback is a call of a function
defined inside another (a closure). The server runs in a process of its own.

    python -m benchmarks.page_road            # the figures
    python -m benchmarks.page_road --edges    # and one page's module crossings
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.pages import ServerProcess

_PACKAGE = "oaipmh_dagster"
_OUTSIDE = ("oaipmh_dagster.demo", "oaipmh_dagster.storage.migrations")


def _ours(frame: FrameType | None) -> str | None:
    """The `oaipmh_dagster` module of a frame (None: not ours)."""
    if frame is None:
        return None
    name = frame.f_globals.get("__name__", "")
    if not name.startswith(_PACKAGE) or name.startswith(_OUTSIDE):
        return None
    return str(name)


def _closure(qualname: str) -> bool:
    """A function defined inside another (not a comprehension nor a dataclass's
    generated method)."""
    if "<locals>" not in qualname or "__create_fn__" in qualname:
        return False
    return not qualname.endswith(("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"))


class Road:
    """Calls, crossings and callbacks seen while profiling."""

    def __init__(self) -> None:
        self.calls = 0
        self.callbacks = 0
        self.edges: Counter[tuple[str, str]] = Counter()
        self.functions: Counter[str] = Counter()
        self.lock = threading.Lock()

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        module = _ours(frame)
        if module is None:
            return
        code = frame.f_code
        caller = frame.f_back
        while caller is not None and _ours(caller) is None:
            caller = caller.f_back
        with self.lock:
            self.calls += 1
            self.functions[f"{module}.{code.co_qualname}"] += 1
            if _closure(code.co_qualname):
                self.callbacks += 1
            where = _ours(caller)
            if where is not None and where != module:
                self.edges[(where, module)] += 1


@contextmanager
def profiled() -> Iterator[Road]:
    road = Road()
    threading.setprofile(road.profile)
    sys.setprofile(road.profile)
    try:
        yield road
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def _harvest(url: str, pages: int) -> Road:
    from oaipmh_dagster.harvesting.harvest import harvest
    from oaipmh_dagster.storage.registry import Harvester
    from oaipmh_dagster.storage.store import Store

    h = Harvester(id=f"road_{pages}_{uuid.uuid4().hex[:6]}", base_url=url,
                  metadata_prefix="oai_dc")
    store = Store()
    with profiled() as road:
        stats = harvest(h, store, run_id=uuid.uuid4().hex)
    assert stats.pages == pages, (stats.pages, pages)
    return road


def measure(pages: int = 3) -> dict[str, Any]:
    """One page's road: a harvest of `pages + 1` one-record pages minus one of `pages`."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["OAIPMH_DATABASE_URL"] = f"sqlite:///{Path(tmp) / 'road.db'}"
        with ServerProcess(pages, page_size=1) as short, \
                ServerProcess(pages + 1, page_size=1) as long:
            _harvest(short.url, pages)  # warm: imports, caches
            a = _harvest(short.url, pages)
            b = _harvest(long.url, pages + 1)
        from oaipmh_dagster.storage.db import dispose_all

        dispose_all()
    edges = b.edges.copy()
    edges.subtract(a.edges)
    functions = b.functions.copy()
    functions.subtract(a.functions)
    return {
        "calls": b.calls - a.calls,
        "crossings": b.edges.total() - a.edges.total(),
        "callbacks": b.callbacks - a.callbacks,
        "closures": sorted(k for k, n in functions.items() if n and _closure(k)),
        "edges": {f"{x} -> {y}": n for (x, y), n in sorted(edges.items()) if n},
        "functions": {k: n for k, n in sorted(functions.items()) if n},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="list one page's crossings")
    parser.add_argument("--functions", action="store_true", help="list one page's calls")
    args = parser.parse_args(argv)
    road = measure()
    print(f"one page: {road['calls']} calls, {road['crossings']} module crossings, "
          f"{road['callbacks']} callbacks")
    print("  callbacks: " + ", ".join(road["closures"]))
    if args.edges:
        for edge, n in road["edges"].items():
            print(f"  {n:3d}  {edge}")
    if args.functions:
        for name, n in road["functions"].items():
            print(f"  {n:3d}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
