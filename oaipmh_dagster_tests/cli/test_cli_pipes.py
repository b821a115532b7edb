"""stdout as Unix tools use it, in real processes and pipes: `--output /dev/stdout` into a
pipe or a file opened for appending, a reader that goes away (`| head`), a closed
stdout (`>&-`). Both databases."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from lxml import etree

from oaipmh_dagster.harvesting.rows import write_page
from oaipmh_dagster.operations.export import FORMATS
from oaipmh_dagster.storage import db
from oaipmh_dagster.storage.store import Store
from oaipmh_dagster_tests.storage.test_store import rec

CLI = [sys.executable, "-m", "oaipmh_dagster.cli"]
N = 1500
ERROR = b"oaipmh-dagster: error: "
# 128 + SIGPIPE: what the shell reports for `cat` whose reader went away.
READER_GONE = 141


@pytest.fixture
def big(database_url: str) -> Store:
    """Harvester `big`: records far larger than a pipe's 64 KiB in every format."""
    store = Store(db.get_engine(database_url))

    def noise(raw: str, element: object = None) -> dict:
        return {"title": "".join(hashlib.sha256(f"{raw}{k}".encode()).hexdigest()
                                 for k in range(4))}  # does not compress away

    write_page(store, "big", [rec(f"oai:big:{i:04d}") for i in range(N)], run_id="r1",
               transform=noise)
    return store


def piped(*argv: str) -> tuple[int, bytes, bytes]:
    """Run the command with stdout and stderr into pipes read to the end."""
    proc = subprocess.run([*CLI, *argv], capture_output=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def ids_of(fmt: str, data: bytes) -> list[str]:
    if fmt == "jsonl":
        return [json.loads(line)["oai_identifier"] for line in data.splitlines()]
    if fmt == "csv":
        return list(pd.read_csv(io.BytesIO(data))["oai_identifier"])
    if fmt == "xml":
        root = etree.fromstring(data)
        return [e.text for e in root.iter("{http://www.openarchives.org/OAI/2.0/}identifier")]
    return list(pd.read_parquet(io.BytesIO(data))["oai_identifier"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_to_dev_stdout_through_a_pipe(big: Store, fmt: str) -> None:
    """/dev/stdout is the pipe stdout is: written as `--output -` is (parquet too: it
    is written front to back and needs no seekable file)."""
    code, out, err = piped("export", "big", "--format", fmt, "--output", "/dev/stdout")
    assert code == 0, err
    assert ids_of(fmt, out) == [f"oai:big:{i:04d}" for i in range(N)]
    assert err.decode() == f"wrote {N} records of big to /dev/stdout\n"  # not in the data


def test_export_to_dev_stdout_appends_where_stdout_appends(big: Store, tmp_path: Path) -> None:
    """`>> file` with `--output /dev/stdout` appends: the file is not replaced."""
    target = tmp_path / "out.jsonl"
    target.write_text("first\n")
    with target.open("ab") as fh:
        proc = subprocess.run([*CLI, "export", "big", "--format", "jsonl", "--output",
                               "/dev/stdout"], stdout=fh, stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = target.read_text().splitlines()
    assert lines[0] == "first" and len(lines) == N + 1
    assert json.loads(lines[1])["oai_identifier"] == "oai:big:0000"


@pytest.mark.parametrize("argv", [
    ["export", "big", "--format", "jsonl", "--output", "-"],
    ["export", "big", "--format", "jsonl", "--output", "/dev/stdout"],
    ["export", "big", "--format", "csv", "--output", "/dev/stdout"],
    ["export", "big", "--format", "parquet", "--output", "-"],
    ["records", "big", "--json"],
    ["records", "big", "--raw"],
    ["records", "big"],  # one write of the whole table, cut short by the reader leaving
], ids=" ".join)
def test_a_reader_that_goes_away_ends_the_command_quietly(big: Store, argv: list[str]) -> None:
    """`... | head -c 10`: no traceback, no error line; exit 141 as `cat` in its place."""
    proc = subprocess.Popen([*CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.read(10)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (READER_GONE, b"")


@pytest.mark.parametrize(("argv", "message"), [
    (["records", "big", "--json"], "cannot write to stdout: it is closed"),
    (["records", "big"], "cannot write to stdout: it is closed"),
    (["export", "big", "--format", "jsonl", "--output", "-"], "cannot write -: stdout is closed"),
    (["export", "big", "--format", "csv", "--output", "/dev/stdout"],
     "cannot write /dev/stdout: stdout is closed"),
])
def test_a_closed_stdout_is_one_error_line(big: Store, argv: list[str], message: str) -> None:
    """`>&-`: one error line, exit 1, as `cat` says `write error: Bad file descriptor`."""
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *CLI, *argv],
                          stderr=subprocess.PIPE, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and err.startswith(ERROR.decode()), err
    assert message in err


def test_export_to_a_file_with_a_closed_stdout(big: Store, tmp_path: Path) -> None:
    """The file is written whole; its summary line then cannot be, which is the same
    error (as `cp -v` fails on a closed stdout after copying)."""
    target = tmp_path / "out.jsonl"
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *CLI, "export", "big",
                           "--format", "jsonl", "--output", str(target)],
                          stderr=subprocess.PIPE, timeout=120)
    assert len(target.read_text().splitlines()) == N
    assert proc.returncode == 1
    assert proc.stderr.decode() == ("oaipmh-dagster: error: cannot write to stdout: it is "
                                    "closed\n")
