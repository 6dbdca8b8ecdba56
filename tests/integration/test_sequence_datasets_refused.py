"""Statistics, export and inspect read Example datasets: a SequenceExample dataset is refused in one line, up front."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests import memfs
from tfrbeam.beam.parquet_export import ExportToParquet
from tfrbeam.beam.stats_combine import ComputeDatasetStats
from tfrbeam.cli.main import main
from tfrbeam.codec.example import encode_sequence_example
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import RecordWriter

_SEQUENCE_EXAMPLE = encode_sequence_example({"id": [7]}, {"tokens": [[1], [2, 3]]})


@pytest.fixture
def sequence_dataset(tmp_path) -> pathlib.Path:
    """A dataset directory whose hand-written manifest says it holds SequenceExamples."""
    root = tmp_path / "seq"
    (root / "train").mkdir(parents=True)
    with RecordWriter(str(root / "train" / "train-00000-of-00001.tfrecord")) as writer:
        writer.write(_SEQUENCE_EXAMPLE)
    manifest = {
        "format": "tfrbeam-dataset/1",
        "record_type": "SequenceExample",
        "features": {"id": {"type": "int64", "shape": [], "always_present": True}},
        "splits": {"train": {"num_examples": 1, "shards": [
            {"path": "train/train-00000-of-00001.tfrecord", "num_examples": 1}]}},
    }
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    return root


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


def test_a_manifest_without_record_type_is_an_example_dataset(sequence_dataset, tmp_path):
    manifest = json.loads((sequence_dataset / "tfrbeam_dataset.json").read_text())
    del manifest["record_type"]
    (sequence_dataset / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    ComputeDatasetStats(str(sequence_dataset))  # read as Examples: no refusal when the pipeline is built
