"""input.path naming a directory (issue 42): `adir` means its files, exactly as `adir/` does."""

from __future__ import annotations

import yaml

from tfrbeam.builder.inputs.files import list_inputs
from tfrbeam.builder.pipeline.infer_config import infer_config
from tfrbeam.cli.build import main as build_main
from tfrbeam.codec.example import decode_example
from tfrbeam.tfrecord.records import read_records


def _csv_directory(tmp_path):
    directory = tmp_path / "adir"
    directory.mkdir()
    (directory / "part-0.csv").write_text("a,b\n1,x\n2,y\n")
    (directory / "part-1.csv").write_text("a,b\n3,z\n")
    return directory


def test_a_directory_without_a_trailing_slash_lists_its_files(tmp_path, monkeypatch):
    directory = _csv_directory(tmp_path)
    with_slash = [item.path for item in list_inputs(str(directory) + "/")]
    assert [item.path for item in list_inputs(str(directory))] == with_slash
    monkeypatch.chdir(tmp_path)
    assert [item.path for item in list_inputs("adir")] == [item.path for item in list_inputs("adir/")]


def _examples(out) -> list[dict]:
    return sorted((decode_example(payload) for shard in sorted(out.glob("train/*.tfrecord*"))
                   for payload in read_records(str(shard))), key=lambda row: row["a"])


def test_a_build_of_a_directory_reads_the_same_rows_with_or_without_the_slash(tmp_path, monkeypatch):
    _csv_directory(tmp_path)
    monkeypatch.chdir(tmp_path)
    for name, path in (("bare", "adir"), ("slash", "adir/")):
        config = {"input": {"path": path, "format": "csv"}, "splits": {"train": 1.0},
                  "output": {"path": f"out-{name}", "num_shards": 1}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        assert build_main([f"{name}.yaml", "--quiet"]) == 0, name  # was: adir: cannot open: [Errno 21] Is a directory
    rows = _examples(tmp_path / "out-bare")
    assert [row["a"] for row in rows] == [[1], [2], [3]]
    assert rows == _examples(tmp_path / "out-slash")


def test_infer_config_on_a_directory_reads_its_files_and_names_the_output_after_it(tmp_path, monkeypatch):
    _csv_directory(tmp_path)
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load(infer_config("adir"))
    assert raw["input"]["format"] == "csv" and raw["input"]["path"] == "adir"
    assert list(raw["features"]) == ["a", "b"]
    assert raw["output"]["path"] == "out/adir"
    assert yaml.safe_load(infer_config("adir/"))["output"]["path"] == "out/adir"
