"""A scalar some records omit (shape [] in the manifest) reads, padded, as a dense [B] array plus a [B] mask."""

from __future__ import annotations

import pathlib

import numpy as np
import pyarrow as pa
import pytest

import tfrbeam
from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import VarLenFeature, open_dataset
from tfrbeam.errors import ExampleDecodeError
from tfrbeam.tfrecord.records import RecordWriter

ROWS = 24
# Zeros, 0.0 and "" are values; rows 8..11 (the third batch of 4) lack every optional column at once.
COUNTS = [None if i % 3 == 1 or 8 <= i < 12 else (i * 7) % 5 for i in range(ROWS)]
SCORES = [None if i % 4 == 2 or 8 <= i < 12 else float(i % 3) / 2 for i in range(ROWS)]
LABELS = [None if i % 5 == 0 or 8 <= i < 12 else ("", "cat", "dog")[i % 3] for i in range(ROWS)]
OPTIONAL = {"count": COUNTS, "score": SCORES, "label": [None if v is None else v.encode() for v in LABELS]}
FILL = {"count": 0, "score": 0.0, "label": b""}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("optional") / "out"
    table = pa.table({"id": pa.array(range(ROWS), pa.int64()), "count": pa.array(COUNTS, pa.int64()),
                      "score": pa.array(SCORES, pa.float64()), "label": pa.array(LABELS, pa.string())})
    tfrbeam.write_dataset(table, root, splits={"train": 1.0}, num_shards=2, shuffle=False, progress=False)
    return root


def _batches(dataset: pathlib.Path, **options) -> list:
    return list(open_dataset(str(dataset), "train", batch_size=4, shuffle_buffer=10, seed=3, executor="threads",
                             **options))


def test_the_manifest_knows_the_optional_columns_are_scalars(dataset):
    features = open_dataset(str(dataset), "train").features
    assert {name: features[name] for name in OPTIONAL} == {
        "count": VarLenFeature("int64", scalar=True), "score": VarLenFeature("float", scalar=True),
        "label": VarLenFeature("bytes", scalar=True)}


def test_padded_optional_scalars_are_dense_rows_with_a_mask_of_the_non_null_pattern(dataset):
    seen = []
    for batch in _batches(dataset, padded=True, return_mask=True):
        ids = batch["id"].tolist()
        seen += ids
        for name, column in OPTIONAL.items():
            assert batch[name].shape == (4,) and batch[f"{name}__mask"].shape == (4,), name
            assert batch[f"{name}__mask"].dtype == np.bool_
            assert batch[f"{name}__mask"].tolist() == [column[i] is not None for i in ids], name
            expected = [FILL[name] if column[i] is None else column[i] for i in ids]
            assert batch[name].tolist() == expected, name
    assert sorted(seen) == list(range(ROWS))


def test_a_batch_where_no_record_holds_the_feature_keeps_its_shape_and_takes_the_pad_value(dataset):
    batches = list(open_dataset(str(dataset), "train", batch_size=4, executor="threads", columns=["id", "count"],
                                padded=True, pad_value=-1, return_mask=True))
    batch = batches[2]
    assert batch["id"].tolist() == [8, 9, 10, 11]
    assert batch["count"].tolist() == [-1, -1, -1, -1] and batch["count"].dtype == np.int64
    assert batch["count__mask"].tolist() == [False] * 4


def test_numpy_and_arrow_outputs_agree(dataset):
    arrays = _batches(dataset, padded=True, return_mask=True)
    records = _batches(dataset, output="arrow")
    assert len(arrays) == len(records) == ROWS // 4
    for batch, record_batch in zip(arrays, records):
        assert record_batch.column("id").to_pylist() == batch["id"].tolist()
        for name in OPTIONAL:
            column = record_batch.column(name)
            assert column.is_valid().to_pylist() == batch[f"{name}__mask"].tolist(), name
            assert [None if row is None else row[0] for row in column.to_pylist()] == [
                value if present else None for value, present in zip(batch[name].tolist(), batch[f"{name}__mask"])], name


def test_unpadded_and_explicit_lengths_read_as_before(dataset):
    (batch, *_) = _batches(dataset)
    assert isinstance(batch["count"], tfrbeam.dataset.Ragged)
    assert batch["count"].lengths.tolist() == [int(COUNTS[i] is not None) for i in batch["id"]]
    (padded, *_) = _batches(dataset, padded={"count": 1}, return_mask=True)
    assert padded["count"].shape == (4, 1) and padded["count__mask"].shape == (4, 1)


def test_a_record_with_two_values_for_a_scalar_is_an_error_not_a_cut(tmp_path):
    with RecordWriter(str(tmp_path / "a.tfrecord")) as writer:
        writer.write_many([encode_example({"count": [1]}), encode_example({"count": [2, 3]})])
    spec = {"count": VarLenFeature("int64", scalar=True)}
    for padded in (True, False):
        dataset = open_dataset(str(tmp_path / "*.tfrecord"), feature_spec=spec, batch_size=2, padded=padded,
                               executor="threads")
        with pytest.raises(ExampleDecodeError, match=r"a\.tfrecord: the record at offset \d+ holds 2 values of "
                                                     r"feature 'count', whose spec says one value"):
            list(dataset)
