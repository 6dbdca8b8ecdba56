"""The manifest's record type, what each type requires, the parse spec of SequenceExample datasets, and reading it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.dataset.spec import read_pinned_manifest
from tfrbeam.errors import ConfigError, ManifestError
from tfrbeam.layout.generation import Generation
from tfrbeam.layout.manifest import (
    load_manifest,
    parse_sequence_example_spec_of,
    read_manifest,
)
from tfrbeam.layout.manifest_schema import Manifest, run_record, validate_manifest
from tfrbeam.layout.names import MANIFEST_FORMAT, MANIFEST_NAME

SPLITS = {"train": {"num_examples": 1, "shards": [{"path": "train/a.tfrecord", "num_examples": 1, "num_bytes": 9,
                                                    "sha256": "0" * 64}]}}
SEQUENCE_KEYS = {"context_features": {}, "sequence_features": {}, "sequence": {}}
# How one run made a dataset, not what the dataset is: in the manifest's "run" record since format 2.
RUN_ONLY = {"run_id", "started", "finished", "runner", "piece_store", "workers", "shuffled_bytes"}


def test_a_manifest_without_record_type_is_an_example_one():
    old = {"format": MANIFEST_FORMAT, "splits": SPLITS, "features": {}}
    validate_manifest(old, "old", verifiable=True)
    assert Manifest.from_dict(old, "old").record_type == "Example"


def test_each_record_type_requires_its_own_schema_keys():
    validate_manifest({"format": MANIFEST_FORMAT, "record_type": "SequenceExample", "splits": SPLITS, **SEQUENCE_KEYS},
                   "m", verifiable=True)
    with pytest.raises(ManifestError, match="m: the key context_features is missing"):
        validate_manifest({"format": MANIFEST_FORMAT, "record_type": "SequenceExample", "splits": SPLITS, "features": {}},
                       "m", verifiable=True)
    with pytest.raises(ManifestError, match="m: the key features is missing"):
        validate_manifest({"format": MANIFEST_FORMAT, "record_type": "Example", "splits": SPLITS, **SEQUENCE_KEYS},
                       "m", verifiable=True)
    with pytest.raises(ManifestError, match="m: record_type 'Tensor' is not one of Example, SequenceExample"):
        validate_manifest({"format": MANIFEST_FORMAT, "record_type": "Tensor", "splits": SPLITS}, "m")


def test_a_build_keeps_how_it_ran_in_one_run_record_apart_from_the_dataset(tmp_path):
    result = tfrbeam.write_dataset(pa.table({"id": list(range(40))}), str(tmp_path / "ds"), num_shards=1, progress=False)
    manifest = json.loads((tmp_path / "ds" / MANIFEST_NAME).read_text())
    assert manifest["format"] == MANIFEST_FORMAT == "tfrbeam-dataset/2"
    assert RUN_ONLY & set(manifest) == set()
    assert set(manifest["run"]) == RUN_ONLY
    assert manifest["run"]["runner"] == "FnApiRunner" and manifest["run"]["workers"]["mode"] == "in_process"
    assert run_record(manifest) == manifest["run"] and manifest == result.manifest
    assert Generation.of(str(tmp_path / "ds"), (tmp_path / "ds" / MANIFEST_NAME).read_bytes()).run_id == (
        manifest["run"]["run_id"])


def test_a_format_1_manifest_with_how_it_ran_at_the_top_level_still_reads(tmp_path):
    run = {"run_id": "r0", "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T00:00:09Z", "runner": "FnApiRunner",
           "piece_store": "memory", "workers": {"count": 1, "mode": "in_process", "chosen_by": "auto"},
           "shuffled_bytes": 12}
    old = {"format": "tfrbeam-dataset/1", "splits": SPLITS, "features": {}, **run}
    data = json.dumps(old).encode()
    path = _written(tmp_path / "ds", data)
    assert load_manifest(str(path), verifiable=True) == (Manifest.from_dict(old, "old"), data)
    assert run_record(old) == run
    assert Generation.of(str(tmp_path / "ds"), data).run_id == "r0"
    new = {"format": MANIFEST_FORMAT, "splits": SPLITS, "features": {}, "run": run}
    validate_manifest(new, "new", verifiable=True)
    assert run_record(new) == run and run_record({**new, "run_id": "stray"}) == run  # format 2 reads only its record
    assert run_record({"format": MANIFEST_FORMAT, "splits": SPLITS}) == {}
    with pytest.raises(ManifestError, match=r"^m: run: expected an object"):
        validate_manifest({**new, "run": ["r0"]}, "m")
    with pytest.raises(ManifestError, match=r"^m: run\.run_id: expected a string"):
        validate_manifest({**new, "run": {**run, "run_id": 7}}, "m")
    with pytest.raises(ManifestError, match=r"^m: format 'tfrbeam-dataset/3' is not"):
        validate_manifest({**new, "format": "tfrbeam-dataset/3"}, "m")


def test_the_parse_sequence_example_spec():
    context = {"user": {"type": "bytes", "shape": [], "always_present": True},
               "age": {"type": "int64", "shape": [], "always_present": False}}
    steps = {"t": {"type": "int64", "shape": [], "always_present": True},
             "emb": {"type": "float", "shape": [3], "always_present": True},
             "delay": {"type": "float", "shape": [], "always_present": False},
             "tags": {"type": "bytes", "shape": None, "always_present": True}}
    assert parse_sequence_example_spec_of(context, steps) == {
        "context_features": {"age": "tf.io.VarLenFeature(tf.int64)", "user": "tf.io.FixedLenFeature([], tf.string)"},
        "sequence_features": {"delay": "tf.io.VarLenFeature(tf.float32)",
                              "emb": "tf.io.FixedLenSequenceFeature([3], tf.float32)",
                              "t": "tf.io.FixedLenSequenceFeature([], tf.int64)", "tags": "tf.io.VarLenFeature(tf.string)"},
    }


# ------------------------------------------------------------------------------ reading it


def _written(directory: Path, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / MANIFEST_NAME
    path.write_bytes(data)
    return path


def test_load_manifest_gives_the_checked_manifest_and_the_bytes_it_read(tmp_path):
    manifest = {"format": MANIFEST_FORMAT, "splits": SPLITS, "features": {}, "run_id": "r1"}
    data = (json.dumps(manifest, indent=2) + "\n").encode()
    path = _written(tmp_path / "ds", data)
    assert load_manifest(str(path)) == (Manifest.from_dict(manifest, "m"), data)
    assert read_manifest(str(tmp_path / "ds")) == Manifest.from_dict(manifest, "m")
    assert read_manifest(str(tmp_path / "none")) is None
    with pytest.raises(FileNotFoundError):
        load_manifest(str(tmp_path / "none" / MANIFEST_NAME))
    damaged = _written(tmp_path / "bad", b'{"format": ')
    with pytest.raises(ManifestError, match=str(damaged)):
        load_manifest(str(damaged))


def test_the_dataset_reader_pins_the_manifest_the_layout_reads_with_its_own_errors(tmp_path):
    manifest = {"format": MANIFEST_FORMAT, "splits": SPLITS, "features": {}, "run_id": "r1"}
    data = json.dumps(manifest).encode()
    path = _written(tmp_path / "ds", data)
    pinned = read_pinned_manifest(str(path))
    assert (pinned.manifest, pinned.generation) == (Manifest.from_dict(manifest, "m"), Generation.of(str(tmp_path / "ds"), data))
    missing = tmp_path / "gone" / MANIFEST_NAME
    with pytest.raises(ConfigError, match=f"^{missing}: cannot read the dataset manifest: .*No such file") as caught:
        read_pinned_manifest(str(missing))
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    damaged = _written(tmp_path / "bad", b"[]")
    with pytest.raises(ManifestError) as by_dataset:
        read_pinned_manifest(str(damaged))
    with pytest.raises(ManifestError) as by_layout:
        load_manifest(str(damaged))
    assert str(by_dataset.value) == str(by_layout.value)


def test_only_the_layout_defines_a_manifest_reader():
    package = Path(tfrbeam.__file__).parent
    readers = [
        path.relative_to(package).as_posix()
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef) and node.name == "read_manifest"
    ]
    assert readers == ["layout/manifest.py"]
