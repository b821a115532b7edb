"""Exports to Parquet, CSV and JSON Lines, through the CLI and the function (both databases)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from oaipmh_dagster import cli, db
from oaipmh_dagster.demo.dataset import make_dataset
from oaipmh_dagster.demo.server import OAIServer
from oaipmh_dagster.export import export, flatten
from oaipmh_dagster.registry import Harvester, Registry
from oaipmh_dagster.store import Store
from oaipmh_dagster_tests.test_store import rec, title_of


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
    store.upsert_page("h", [rec("a", sets=("s1", "s2")), rec("b"), rec("c"),
                            rec("d", deleted=True)], run_id="r1", transform=_fail_on_c)
    store.upsert_page("other", [rec("z")], run_id="r1", transform=title_of)
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
    from oaipmh_dagster.harvest import harvest

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
