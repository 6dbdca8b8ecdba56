"""Wide records: decoding cost grows with a record's features, linearly, and a record past the limit is refused by name."""

from __future__ import annotations

import pathlib
import tracemalloc

import numpy as np
import pytest

import tfrbeam.codec.decode as columnar_decode
from tfrbeam.codec.decode import DEFAULT_MAX_FEATURES, examples_to_record_batch
from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import FixedLenFeature, open_dataset
from tfrbeam.errors import RecordLimitError
from tfrbeam.tfrecord.records import RecordWriter


def wide_record(features: int) -> bytes:
    return encode_example({f"f{i:07d}": i for i in range(features)})


def write(path: pathlib.Path, payloads: list[bytes]) -> str:
    with RecordWriter(str(path)) as writer:
        for payload in payloads:
            writer.write(payload)
    return str(path)


@pytest.fixture(scope="module")
def million(tmp_path_factory) -> tuple[bytes, str]:
    """The measured case: one ~21 MB Example of 1,000,000 int64 features, after a small record."""
    payload = wide_record(1_000_000)
    assert 20_000_000 < len(payload) < 22_000_000
    small = encode_example({"f0000000": 1})
    return payload, write(tmp_path_factory.mktemp("wide") / "wide.tfrecord", [small, payload])


def test_the_million_feature_record_is_refused_by_name_in_examples_to_record_batch(million):
    payload, _ = million
    with pytest.raises(
        RecordLimitError,
        match=rf"record 1 of the batch \({len(payload)} bytes\) has more than {DEFAULT_MAX_FEATURES} features.*max_features",
    ) as info:
        examples_to_record_batch([encode_example({"a": 1}), payload])
    assert (info.value.record, info.value.limit) == (1, DEFAULT_MAX_FEATURES)


def test_the_million_feature_record_is_refused_by_name_in_open_dataset(million):
    _, path = million
    with pytest.raises(RecordLimitError, match=rf"{path}: record 1 has more than {DEFAULT_MAX_FEATURES} features.*max_features"):
        open_dataset(path, executor="threads")  # inferring the spec meets it first
    dataset = open_dataset(path, feature_spec={"f0000000": FixedLenFeature((), "int64")}, executor="threads", batch_size=1)
    offset = 16 + len(encode_example({"f0000000": 1}))
    with pytest.raises(
        RecordLimitError,
        match=rf"{path}: the record at offset {offset} has more than {DEFAULT_MAX_FEATURES} features.*max_features",
    ):
        list(dataset)
    raw = [batch["record"][0] for batch in open_dataset(path, raw=True, executor="threads", batch_size=1)]
    assert len(raw[1]) == len(million[0])  # raw reads are not limited


def test_the_limit_can_be_raised_or_lifted(tmp_path):
    payload = wide_record(3000)
    with pytest.raises(RecordLimitError, match="more than 2000 features"):
        examples_to_record_batch([payload], max_features=2000)
    for limit in (3000, None):
        batch = examples_to_record_batch([payload], max_features=limit)
        assert batch.num_columns == 3000 and batch.column("f0002999").to_pylist() == [[2999]]
    path = write(tmp_path / "w.tfrecord", [payload, wide_record(10)])
    with pytest.raises(RecordLimitError, match=r"w\.tfrecord: record 0 has more than 2000"):
        open_dataset(path, max_features=2000, executor="threads")
    batches = list(open_dataset(path, max_features=3000, executor="threads", batch_size=2))
    assert batches[0]["f0002999"].values.tolist() == [2999] and batches[0]["f0000009"].tolist() == [9, 9]


def test_narrow_records_are_never_counted(monkeypatch):
    counted: list[int] = []
    original = columnar_decode._count_entries
    monkeypatch.setattr(columnar_decode, "_count_entries", lambda *args: counted.append(1) or original(*args))
    examples_to_record_batch([encode_example({"a": list(range(50)), "b": b"x" * 1000}) for _ in range(100)])
    assert counted == []


def _decode_cost(features: int) -> tuple[int, int, int]:
    """(lockstep walk steps, columns, peak bytes numpy and Python allocated) decoding one record of ``features``."""
    payload = wide_record(features)
    steps = 0
    original = columnar_decode._Walk._step

    def counting(self, *args):
        nonlocal steps
        steps += 1
        return original(self, *args)

    columnar_decode._Walk._step = counting
    try:
        tracemalloc.start()
        batch = examples_to_record_batch([payload])
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    finally:
        columnar_decode._Walk._step = original
    return steps, batch.num_columns, peak


def test_a_wide_record_costs_work_and_memory_linear_in_its_features():
    costs = {features: _decode_cost(features) for features in (1000, 2000, 4000, 8000)}
    for features, (steps, columns, _) in costs.items():
        assert steps == features and columns == features  # one walk step and one column per feature, nothing per pair
    per_feature = np.array([peak / features for features, (_, _, peak) in costs.items()])
    assert per_feature.max() / per_feature.min() < 1.5, per_feature  # memory per feature does not grow with width
