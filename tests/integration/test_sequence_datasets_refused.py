"""Statistics, export and inspect read Example datasets: a SequenceExample dataset is refused in one line, up front."""

from __future__ import annotations

import json
import pathlib

import apache_beam as beam
import pyarrow.parquet as pq
import pytest

from tests import memfs
from tfrbeam.beam.parquet_export import ExportToParquet
from tfrbeam.beam.stats_combine import ComputeDatasetStats, WriteStatsFiles
from tfrbeam.cli.main import main
from tfrbeam.codec.example import encode_example, encode_sequence_example
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import RecordWriter

_SEQUENCE_EXAMPLE = encode_sequence_example({"id": [7]}, {"tokens": [[1], [2, 3]]})


def _dataset(root: pathlib.Path, records: list[bytes], **manifest_keys: object) -> pathlib.Path:
    """A one-shard dataset directory of ``records`` with a hand-written manifest (an int64 ``id`` feature)."""
    (root / "train").mkdir(parents=True)
    with RecordWriter(str(root / "train" / "train-00000-of-00001.tfrecord")) as writer:
        writer.write_many(records)
    manifest = {
        "format": "tfrbeam-dataset/1",
        **manifest_keys,
        "features": {"id": {"type": "int64", "shape": [], "always_present": True}},
        "splits": {"train": {"num_examples": len(records), "shards": [
            {"path": "train/train-00000-of-00001.tfrecord", "num_examples": len(records)}]}},
    }
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture
def sequence_dataset(tmp_path) -> pathlib.Path:
    """A dataset directory whose hand-written manifest says it holds SequenceExamples."""
    return _dataset(tmp_path / "seq", [_SEQUENCE_EXAMPLE], record_type="SequenceExample")


def _refusal(root: pathlib.Path) -> str:
    return f"{root} holds SequenceExamples; stats/export read Example datasets only"


@pytest.mark.parametrize("command", [
    ["stats", "{root}"], ["stats", "{root}/train", "--output-dir", "{out}"], ["export", "{root}", "{out}"],
    ["export", "{root}/train/*.tfrecord", "{out}"], ["inspect", "{root}"], ["inspect", "{root}/train"],
])
def test_the_commands_refuse_a_sequence_example_dataset_in_one_line(sequence_dataset, tmp_path, capsys, command):
    out = tmp_path / "out"
    arguments = [part.format(root=sequence_dataset, out=out) for part in command]
    assert main(arguments) == 2
    err = capsys.readouterr().err
    assert err == f"tfrbeam: error: {_refusal(sequence_dataset)}\n"
    assert not out.exists() and not (sequence_dataset / "stats.json").exists()


def test_the_beam_transforms_refuse_it_when_built(sequence_dataset, tmp_path):
    with pytest.raises(ConfigError, match=_refusal(sequence_dataset)):
        ComputeDatasetStats(str(sequence_dataset))
    with pytest.raises(ConfigError, match=_refusal(sequence_dataset)):
        ExportToParquet(str(sequence_dataset), str(tmp_path / "out"))
    remote = memfs.upload(sequence_dataset, "memfs://bucket/seq")
    try:
        with pytest.raises(ConfigError, match="memfs://bucket/seq holds SequenceExamples"):
            ComputeDatasetStats(remote)
    finally:
        memfs.clear("memfs://bucket")


def _id_figures(stats_json: pathlib.Path) -> tuple[int, int, int, int]:
    """(examples, examples with an id, smallest id, largest id) of the train split in a stats.json."""
    split = json.loads(stats_json.read_text())["splits"]["train"]
    feature = split["features"]["id"]
    return split["num_examples"], feature["present"], feature["min"], feature["max"]


def test_a_manifest_without_record_type_is_an_example_dataset(tmp_path):
    """A manifest that names no record type (as every one did before SequenceExample builds) holds Examples: the
    Beam transform, ``tfrbeam stats`` and ``tfrbeam export`` read its records as Examples."""
    root = _dataset(tmp_path / "examples", [encode_example({"id": [7]}), encode_example({"id": [9]})])
    with beam.Pipeline() as pipeline:
        _ = pipeline | ComputeDatasetStats(str(root)) | WriteStatsFiles(str(tmp_path / "beam-stats"))
    assert _id_figures(tmp_path / "beam-stats" / "stats.json") == (2, 2, 7, 9)
    assert main(["stats", str(root)]) == 0
    assert _id_figures(root / "stats.json") == (2, 2, 7, 9)
    assert main(["export", str(root), str(tmp_path / "out")]) == 0
    exported = pq.read_table(tmp_path / "out" / "train").column("id").to_pylist()
    assert sorted(exported) == [7, 9]
