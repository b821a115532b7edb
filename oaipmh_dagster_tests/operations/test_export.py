"""Exports to Parquet, CSV and JSON Lines, through the CLI and the function (both databases)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from oaipmh_dagster.cli import commands as cli
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.operations.export import FORMATS, export
from oaipmh_dagster.operations.flat import flatten
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.registry import Harvester, Registry
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.storage.test_store import rec, title_of


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        cli.main(list(argv))
    out = capsys.readouterr()
    return (done.value.code or 0), out.out, out.err


def _fail_on_c(raw: str, element: object = None) -> dict:
    if ">c<" in raw:
        raise ValueError("cannot read c")
    return title_of(raw) | {"creators": ["X, A.", "Y, B."], "extra": {"k": "v"}}


@pytest.fixture
def stored(database_url: str) -> Store:
    """Harvester `h` with two live records, one tombstone and one failed record."""
    store = Store(db.get_engine(database_url))
    write_page(store, "h", [rec("a", sets=("s1", "s2")), rec("b"), rec("c"),
                            rec("d", deleted=True)], run_id="r1", transform=_fail_on_c)
    write_page(store, "other", [rec("z")], run_id="r1", transform=title_of)
    return store


def test_flatten() -> None:
    flat = flatten({"oai_identifier": "a", "datestamp": "2024-01-01T00:00:00Z",
                    "deleted": False, "sets": ["s1", "s2"], "errors": [],
                    "metadata": {"title": "T" * 20, "creators": ["A", "B"],
                                 "ids": [{"x": 1}], "extra": {"k": "v"}, "n": 3}},
                   max_len=10)
    assert flat["sets"] == "s1 | s2" and flat["errors"] == ""
    assert flat["metadata.creators"] == "A | B"
    assert flat["metadata.ids"] == '{"x": 1}'
    assert flat["metadata.extra"] == '{"k": "v"}'
    assert flat["metadata.title"] == "T" * 9 + "…"
    assert flat["metadata.n"] == 3


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_cli_export(capsys: pytest.CaptureFixture[str], stored: Store, tmp_path: Path,
                    fmt: str) -> None:
    path = tmp_path / f"out.{fmt}"
    code, out, err = run(capsys, "export", "h", "--format", fmt, "--output", str(path))
    assert code == 0, err
    assert "wrote 4 records" in out
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers
    if fmt == "parquet":
        frame = pd.read_parquet(path)
        assert list(frame.columns) == ["oai_identifier", "datestamp", "deleted", "sets",
                                       "metadata", "errors", "harvested_at", "run_id"]
        assert list(frame["oai_identifier"]) == ["a", "b", "c", "d"]
        assert list(frame["sets"].iloc[0]) == ["s1", "s2"]
        assert json.loads(frame["metadata"].iloc[0])["creators"] == ["X, A.", "Y, B."]
        assert pd.isna(frame["metadata"].iloc[3])
        assert list(frame["deleted"]) == [False, False, False, True]
        assert json.loads(frame["errors"].iloc[2])[0]["message"] == "cannot read c"
        assert set(frame["run_id"]) == {"r1"}
    elif fmt == "csv":
        frame = pd.read_csv(path, keep_default_na=False)
        assert list(frame["oai_identifier"]) == ["a", "b", "c", "d"]
        assert frame["sets"].iloc[0] == "s1 | s2"
        assert frame["metadata.title"].iloc[1] == "b"
        assert frame["metadata.creators"].iloc[0] == "X, A. | Y, B."
        assert json.loads(frame["metadata.extra"].iloc[0]) == {"k": "v"}
        assert frame["metadata.title"].iloc[3] == ""  # the tombstone has no metadata
        assert list(frame["deleted"].astype(str)) == ["False", "False", "False", "True"]
        assert json.loads(frame["errors"].iloc[2])[0]["type"] == "ValueError"
        assert frame["errors"].iloc[0] == ""
    else:
        frame = pd.read_json(path, lines=True)
        assert list(frame["oai_identifier"]) == ["a", "b", "c", "d"]
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert lines[0]["metadata"]["title"] == "a"
        assert lines[0]["sets"] == ["s1", "s2"]
        assert lines[3]["deleted"] is True and lines[3]["metadata"] is None
        assert lines[2]["errors"][0]["message"] == "cannot read c"
        assert all(line["datestamp"].endswith("Z") for line in lines)


PARQUET_TYPES = {
    "oai_identifier": "string", "datestamp": "timestamp[ms, tz=UTC]", "deleted": "bool",
    "sets": "list<element: string>", "metadata": "string", "errors": "string",
    "harvested_at": "timestamp[ms, tz=UTC]", "run_id": "string",
}


def _parquet_types(path: Path) -> dict[str, str]:
    import pyarrow.parquet as pq

    return {f.name: str(f.type) for f in pq.read_schema(path)}


def test_export_parquet_types(capsys: pytest.CaptureFixture[str], stored: Store,
                              tmp_path: Path) -> None:
    """Timestamps in UTC, sets a list, metadata and errors JSON strings, also when empty."""
    from datetime import UTC, datetime

    path = tmp_path / "out.parquet"
    code, _, err = run(capsys, "export", "h", "--format", "parquet", "--output", str(path))
    assert code == 0, err
    assert _parquet_types(path) == PARQUET_TYPES
    frame = pd.read_parquet(path)
    assert frame["datestamp"].iloc[0] == pd.Timestamp(datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert frame["harvested_at"].iloc[0].tzinfo is not None
    assert abs(frame["harvested_at"].iloc[0] - pd.Timestamp.now(tz="UTC")) < pd.Timedelta("1h")
    assert list(frame["sets"].iloc[1]) == []
    assert json.loads(frame["errors"].iloc[0]) == []
    empty = tmp_path / "empty.parquet"
    assert export(stored, "nobody", "parquet", empty) == 0
    assert _parquet_types(empty) == PARQUET_TYPES


def test_export_parquet_unreadable_datestamp_is_null(database_url: str,
                                                     tmp_path: Path) -> None:
    store = Store(db.get_engine(database_url))
    write_page(store, "h", [rec("a", "not a date"), rec("b")], run_id="r1", transform=title_of)
    path = tmp_path / "out.parquet"
    assert export(store, "h", "parquet", path) == 2
    frame = pd.read_parquet(path)
    assert pd.isna(frame["datestamp"].iloc[0]) and not pd.isna(frame["datestamp"].iloc[1])
    assert json.loads(frame["errors"].iloc[0])[0]["type"] == "datestamp"


def test_export_parquet_is_written_batch_by_batch(stored: Store, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """One row group per batch: the records are never all in memory at once."""
    import pyarrow.parquet as pq

    from oaipmh_dagster.operations import export as export_module

    monkeypatch.setattr(export_module, "BATCH", 3)
    path = tmp_path / "out.parquet"
    assert export(stored, "h", "parquet", path) == 4
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 2
    assert [meta.row_group(i).num_rows for i in range(2)] == [3, 1]
    assert list(pd.read_parquet(path)["oai_identifier"]) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_export_to_missing_directory(capsys: pytest.CaptureFixture[str], stored: Store,
                                     tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "missing" / f"out.{fmt}"
    code, out, err = run(capsys, "export", "h", "--format", fmt, "--output", str(path))
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("oaipmh-dagster: error:")
    assert "does not exist" in lines[0]
    assert out == ""
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("argv", [
    ["--format", "xlsx", "--output", "x.xlsx"],
    ["--format", "csv"],
    ["--output", "x.csv"],
])
def test_export_usage_errors(capsys: pytest.CaptureFixture[str], stored: Store,
                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             argv: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    before = set(tmp_path.iterdir())
    code, _, err = run(capsys, "export", "h", *argv)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("oaipmh-dagster: error:")
    assert set(tmp_path.iterdir()) == before


def test_export_to_a_directory_is_refused(capsys: pytest.CaptureFixture[str], stored: Store,
                                          tmp_path: Path) -> None:
    code, _, err = run(capsys, "export", "h", "--format", "csv", "--output", str(tmp_path))
    assert code == 2 and err.startswith("oaipmh-dagster: error:")


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_export_empty(stored: Store, tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"empty.{fmt}"
    assert export(stored, "nobody", fmt, path) == 0
    assert path.exists()
    if fmt == "parquet":
        assert len(pd.read_parquet(path)) == 0
    elif fmt == "csv":
        assert list(pd.read_csv(path).columns)[:2] == ["oai_identifier", "datestamp"]
    else:
        assert path.read_text() == ""


def test_export_failure_leaves_nothing(stored: Store, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    path = folder / "out.csv"
    path.write_text("previous\n")

    def explode(*args, **kwargs):
        yield from [{"oai_identifier": "a"}]  # not a full record: flatten fails

    monkeypatch.setattr(stored, "iter_records", explode)
    with pytest.raises(KeyError):
        export(stored, "h", "csv", path)
    assert path.read_text() == "previous\n"  # the old file is untouched
    assert sorted(p.name for p in folder.iterdir()) == ["out.csv"]
    with pytest.raises(ValueError, match="unknown format"):
        export(stored, "h", "xlsx", tmp_path / "x.xlsx")


@pytest.fixture
def server() -> Iterator[OAIServer]:
    srv = OAIServer(make_dataset(30, seed=3), page_size=7).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_export_after_real_harvest(capsys: pytest.CaptureFixture[str], database_url: str,
                                   server: OAIServer, tmp_path: Path, fmt: str) -> None:
    from oaipmh_dagster.harvesting.harvest import harvest

    h = Registry(db.get_engine()).add(Harvester(id="demo", base_url=server.base_url,
                                                metadata_prefix="oai_dc"))
    harvest(h, Store(), run_id="t")
    path = tmp_path / f"demo.{fmt}"
    code, out, err = run(capsys, "export", "demo", "--format", fmt, "--output", str(path))
    assert code == 0, err
    served = sorted(server.dataset.records, key=lambda r: r.identifier)
    if fmt == "parquet":
        frame = pd.read_parquet(path)
    elif fmt == "csv":
        frame = pd.read_csv(path, keep_default_na=False)
    else:
        frame = pd.read_json(path, lines=True, dtype=False)
    assert list(frame["oai_identifier"]) == [r.identifier for r in served]
    assert [bool(d) if not isinstance(d, str) else d == "True" for d in frame["deleted"]] == [
        r.deleted for r in served]
    live = [i for i, r in enumerate(served) if not r.deleted]
    if fmt == "csv":
        assert all(frame["metadata.title"].iloc[i] for i in live)
    elif fmt == "parquet":
        assert all(json.loads(frame["metadata"].iloc[i])["title"] for i in live)
    else:
        assert all(frame["metadata"].iloc[i]["title"] for i in live)


# -- where the export is written ------------------------------------------------------

ERROR = "oaipmh-dagster: error: "


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
    assert lines[0].startswith(ERROR), lines[0]
    return lines[0]


def folder(tmp_path: Path) -> Path:
    """An empty folder of its own (tmp_path also holds the database and the Dagster home)."""
    path = tmp_path / "out"
    path.mkdir()
    return path


def empty_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory: shows whether a file named '-' was written."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def csv_ids(text: str) -> list[str]:
    return list(pd.read_csv(io.StringIO(text), keep_default_na=False)["oai_identifier"])


def test_export_through_a_symlink(capsys: pytest.CaptureFixture[str], stored: Store,
                                  tmp_path: Path) -> None:
    tmp_path = folder(tmp_path)
    target = tmp_path / "real.csv"
    target.write_text("previous\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    code, _, err = run(capsys, "export", "h", "--format", "csv", "--output", str(link))
    assert code == 0, err
    assert link.is_symlink() and link.resolve() == target
    assert csv_ids(target.read_text()) == ["a", "b", "c", "d"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "real.csv"]


def test_export_through_a_dangling_symlink(capsys: pytest.CaptureFixture[str], stored: Store,
                                           tmp_path: Path) -> None:
    tmp_path = folder(tmp_path)
    target = tmp_path / "new.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    code, _, err = run(capsys, "export", "h", "--format", "jsonl", "--output", str(link))
    assert code == 0, err
    assert link.is_symlink() and target.is_file()
    assert len(target.read_text().splitlines()) == 4


def test_export_to_a_character_device(capsys: pytest.CaptureFixture[str], stored: Store,
                                      tmp_path: Path) -> None:
    """A device (here a private copy of /dev/null) is written in place, never replaced."""
    tmp_path = folder(tmp_path)
    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        device.write_text("probe")
    except OSError as exc:
        pytest.skip(f"cannot make a character device here: {exc}")
    for fmt in FORMATS:
        code, _, err = run(capsys, "export", "h", "--format", fmt, "--output", str(device))
        assert code == 0, err
        assert stat.S_ISCHR(device.stat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_of_an_unknown_harvester_writes_nothing(
        capsys: pytest.CaptureFixture[str], stored: Store, tmp_path: Path, fmt: str) -> None:
    target = folder(tmp_path) / f"out.{fmt}"
    code, out, err = run(capsys, "export", "nope", "--format", fmt, "--output", str(target))
    assert code == 1
    assert one_error_line(err).startswith("oaipmh-dagster: error: no harvester 'nope'")
    assert out == "" and list(target.parent.iterdir()) == []


def test_export_to_dev_null(capsys: pytest.CaptureFixture[str], stored: Store) -> None:
    code, out, err = run(capsys, "export", "h", "--format", "csv", "--output", os.devnull)
    assert code == 0, err
    assert "wrote 4 records" in out
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_export_to_a_named_pipe(capsys: pytest.CaptureFixture[str], stored: Store,
                                tmp_path: Path) -> None:
    tmp_path = folder(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with fifo.open("rb") as fh:
            received.append(fh.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    code, _, err = run(capsys, "export", "h", "--format", "jsonl", "--output", str(fifo))
    reader.join(timeout=10)
    assert code == 0, err
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert not reader.is_alive(), "nothing was written into the pipe"
    lines = received[0].decode().splitlines()
    assert [json.loads(line)["oai_identifier"] for line in lines] == ["a", "b", "c", "d"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_to_stdout(capsys: pytest.CaptureFixture[str], stored: Store, tmp_path: Path,
                          monkeypatch: pytest.MonkeyPatch, fmt: str) -> None:
    cwd = empty_cwd(tmp_path, monkeypatch)
    code, out, err = run(capsys, "export", "h", "--format", fmt, "--output", "-")
    assert code == 0, err
    if fmt == "csv":
        assert csv_ids(out) == ["a", "b", "c", "d"]
    else:
        assert [json.loads(line)["oai_identifier"] for line in out.splitlines()] == [
            "a", "b", "c", "d"]
    assert "wrote 4 records" in err  # the summary stays out of the data
    assert list(cwd.iterdir()) == []  # no file named '-'


def test_export_parquet_to_stdout(capsysbinary: pytest.CaptureFixture[bytes], stored: Store,
                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = empty_cwd(tmp_path, monkeypatch)
    with pytest.raises(SystemExit) as done:
        cli.main(["export", "h", "--format", "parquet", "--output", "-"])
    captured = capsysbinary.readouterr()
    assert (done.value.code or 0) == 0, captured.err
    frame = pd.read_parquet(io.BytesIO(captured.out))
    assert list(frame["oai_identifier"]) == ["a", "b", "c", "d"]
    assert list(cwd.iterdir()) == []


def test_export_parquet_to_a_terminal_is_refused(
        capsys: pytest.CaptureFixture[str], stored: Store, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cwd = empty_cwd(tmp_path, monkeypatch)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    code, out, err = run(capsys, "export", "h", "--format", "parquet", "--output", "-")
    assert code == 2
    assert "terminal" in one_error_line(err)
    assert out == "" and list(cwd.iterdir()) == []


def test_export_replaces_a_regular_file_keeping_its_mode(
        capsys: pytest.CaptureFixture[str], stored: Store, tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    path.write_text("previous\n")
    path.chmod(0o640)
    before = path.stat().st_ino
    code, _, err = run(capsys, "export", "h", "--format", "csv", "--output", str(path))
    assert code == 0, err
    assert path.stat().st_ino != before  # a new file renamed into place
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert csv_ids(path.read_text()) == ["a", "b", "c", "d"]
    new = tmp_path / "new.csv"
    assert run(capsys, "export", "h", "--format", "csv", "--output", str(new))[0] == 0
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~umask  # not a private temp file's


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Mount small tmpfs file systems (root only; skips where mounting is not allowed)."""
    mounted: list[Path] = []

    def mount(name: str, *options: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs",
                               str(point)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(point)
        return point

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture
def many(database_url: str) -> Store:
    """Harvester `big` with records far larger than 64 KiB in any format."""
    store = Store(db.get_engine(database_url))
    def noise(raw: str, element: object = None) -> dict:
        return {"title": "".join(hashlib.sha256(f"{raw}{k}".encode()).hexdigest()
                                 for k in range(4))}  # does not compress away

    write_page(store, "big", [rec(f"oai:big:{i:04d}") for i in range(2000)], run_id="r1",
                      transform=noise)
    return store


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
def test_export_onto_a_full_disk(capsys: pytest.CaptureFixture[str], many: Store,
                                 tiny_tmpfs: Callable[..., Path], fmt: str) -> None:
    disk = tiny_tmpfs("full", "size=64k")
    (disk / "keep.txt").write_text("previous\n")
    for name in ("new", "keep.txt"):
        code, out, err = run(capsys, "export", "big", "--format", fmt, "--output",
                             str(disk / name))
        assert code == 1
        assert "No space left on device" in one_error_line(err)
        assert out == ""
        assert sorted(p.name for p in disk.iterdir()) == ["keep.txt"]  # no partial, no temp
        assert (disk / "keep.txt").read_text() == "previous\n"


def test_export_full_disk_simulated(capsys: pytest.CaptureFixture[str], stored: Store,
                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same without a tmpfs: flushing the written data to disk fails with ENOSPC."""
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    folder = tmp_path / "exports"
    folder.mkdir()
    (folder / "keep.csv").write_text("previous\n")
    monkeypatch.setattr(os, "fsync", no_space)
    for name in ("new.csv", "keep.csv"):
        code, _, err = run(capsys, "export", "h", "--format", "csv", "--output",
                           str(folder / name))
        assert code == 1
        assert "No space left on device" in one_error_line(err)
        assert sorted(p.name for p in folder.iterdir()) == ["keep.csv"]
        assert (folder / "keep.csv").read_text() == "previous\n"


def test_export_to_a_read_only_place(capsys: pytest.CaptureFixture[str], stored: Store,
                                     tiny_tmpfs: Callable[..., Path]) -> None:
    place = tiny_tmpfs("ro", "size=64k", "ro")
    code, out, err = run(capsys, "export", "h", "--format", "csv", "--output",
                         str(place / "out.csv"))
    assert code == 1
    assert "Read-only file system" in one_error_line(err)
    assert out == "" and list(place.iterdir()) == []


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_to_stdout_whose_reader_goes_away(many: Store, fmt: str) -> None:
    """`export --output - | head` ends quietly with 141, like other commands whose
    stdout's reader goes away (see test_cli_pipes.py)."""
    proc = subprocess.Popen([sys.executable, "-m", "oaipmh_dagster.cli", "export", "big",
                             "--format", fmt, "--output", "-"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""
