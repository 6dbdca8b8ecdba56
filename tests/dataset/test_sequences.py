"""Reading SequenceExample datasets: context features as Example features, feature lists as Ragged over steps.

The datasets here are written the way a sequence build writes them (``encode_sequence_batch`` on
a table of rows grouped by user, a manifest that follows issue 13's contract) and compared,
record by record, with ``decode_sequence_example``.
"""

from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.helpers import with_float32_bits
from tfrbeam.codec.example import decode_sequence_example, encode_example, encode_sequence_example
from tfrbeam.codec.sequence_encode import encode_sequence_batch
from tfrbeam.dataset import (
    FixedLenFeature,
    FixedLenSequenceFeature,
    Ragged,
    VarLenFeature,
    VarLenSequenceFeature,
    open_dataset,
    open_random_access,
)
from tfrbeam.errors import ArrowConversionError, ConfigError, ExampleDecodeError
from tfrbeam.tfrecord.records import RecordWriter, read_records

CONTEXT = ["user", "country"]
LISTS = ["t", "xy", "tags", "clicks"]


def user_table(users: int, seed: int = 0) -> tuple[pa.Table, np.ndarray]:
    """Rows of ``users`` users (1 to 9 steps each, in step order) and the group offsets."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 10, users)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rows = int(offsets[-1])
    user = np.repeat(np.arange(users), sizes)
    table = pa.table({
        "user": pa.array(user, pa.int64()),
        "country": pa.array([None if u % 4 == 3 else f"c{u % 3}" for u in user.tolist()]),  # absent for some users
        "t": pa.array(np.arange(rows, dtype=np.float32) / 4),
        "xy": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * rows, dtype=np.int64)), 2),
        "tags": pa.array([None if r % 7 == 0 else [f"g{r}".encode()] * (r % 3) for r in range(rows)], pa.list_(pa.binary())),
        "clicks": pa.array(rng.integers(-5, 5, rows)),
    })
    return table, offsets


def write_dataset(root: pathlib.Path, users: int = 60, shards: int = 3, seed: int = 0) -> list[bytes]:
    """A SequenceExample dataset with split "train" and its manifest (the contract's keys); returns the records."""
    table, offsets = user_table(users, seed)
    records = encode_sequence_batch(table, offsets, CONTEXT, LISTS).to_list()
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    bounds = np.linspace(0, users, shards + 1).astype(int)
    for number, (first, last) in enumerate(zip(bounds[:-1], bounds[1:])):
        name = f"train/train-{number:05d}-of-{shards:05d}.tfrecord"
        (root / "train").mkdir(exist_ok=True)
        with RecordWriter(str(root / name)) as writer:
            writer.write_many(records[first:last])
        data = (root / name).read_bytes()
        entries.append({"path": name, "num_examples": int(last - first), "num_bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
    steps = np.diff(offsets)
    manifest = {
        "format": "tfrbeam-dataset/1",
        "record_type": "SequenceExample",
        "compression": None,
        "context_features": {
            "country": {"type": "bytes", "shape": [], "always_present": False},
            "user": {"type": "int64", "shape": [], "always_present": True},
        },
        "sequence_features": {
            "clicks": {"type": "int64", "shape": [], "always_present": True},
            "tags": {"type": "bytes", "shape": None, "always_present": False},
            "t": {"type": "float", "shape": [], "always_present": True},
            "xy": {"type": "int64", "shape": [2], "always_present": True},
        },
        "parse_sequence_example_spec": {
            "context_features": {"country": "tf.io.VarLenFeature(tf.string)",
                                 "user": "tf.io.FixedLenFeature([], tf.int64)"},
            "sequence_features": {"clicks": "tf.io.FixedLenSequenceFeature([], tf.int64)",
                                  "tags": "tf.io.VarLenFeature(tf.string)",
                                  "t": "tf.io.FixedLenSequenceFeature([], tf.float32)",
                                  "xy": "tf.io.FixedLenSequenceFeature([2], tf.int64)"},
        },
        "sequence": {"group_by": ["user"], "order_by": [], "context": CONTEXT, "max_steps": None,
                     "overflow": "split", "min_steps": 1},
        "splits": {"train": {
            "num_examples": users, "num_bytes": sum(e["num_bytes"] for e in entries), "shards": entries,
            "num_groups": users, "steps": {"total": int(steps.sum()), "min": int(steps.min()),
                                           "mean": float(steps.mean()), "max": int(steps.max())},
            "dropped_groups": {"too_few_steps": 0, "bad": 0}, "split_groups": 0, "truncated_steps": 0,
            "examples_with_feature": {"user": users, "country": int(sum(u % 4 != 3 for u in range(users)))},
            "steps_with_feature": {"t": int(steps.sum())},
        }},
    }
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest, indent=2))
    return records


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[pathlib.Path, dict[int, tuple[dict, dict]]]:
    root = tmp_path_factory.mktemp("sequences")
    records = write_dataset(root)
    return root, {context["user"][0]: (context, lists) for context, lists in map(decode_sequence_example, records)}


def check_batch(batch: dict, expected: dict[int, tuple[dict, dict]]) -> list[int]:
    """Every row of a numpy batch against its record's decoding; returns the users."""
    users = batch["user"].tolist()
    for position, user in enumerate(users):
        context, lists = expected[user]
        assert batch["country"].row(position).tolist() == context.get("country", [])
        assert batch["t"].row(position).tolist() == [step[0] for step in lists["t"]]
        assert batch["clicks"].row(position).tolist() == [step[0] for step in lists["clicks"]]
        assert batch["xy"].row(position).tolist() == lists["xy"]
        tags = batch["tags"].row(position)
        assert isinstance(tags, Ragged) and [step.tolist() for step in tags.to_list()] == lists["tags"]
    return users


def test_the_manifest_gives_the_spec_and_batches_hold_every_record_once(dataset):
    root, expected = dataset
    reader = open_dataset(root, "train", batch_size=7, executor="threads")
    assert reader.source.record_type == "SequenceExample"
    assert reader.features == {
        "country": VarLenFeature("bytes", scalar=True), "user": FixedLenFeature((), "int64"),  # some users lack it
        "clicks": FixedLenSequenceFeature((), "int64"), "tags": VarLenSequenceFeature("bytes"),
        "t": FixedLenSequenceFeature((), "float"), "xy": FixedLenSequenceFeature((2,), "int64"),
    }
    assert reader.num_records == 60 and len(reader) == 9
    users = []
    for batch in reader:
        assert batch["user"].dtype == np.int64 and batch["t"].values.dtype == np.float32
        assert batch["xy"].values.shape == (int(batch["xy"].lengths.sum()), 2)
        assert batch["tags"].values.values.dtype == object
        users += check_batch(batch, expected)
    assert users == list(range(60))


def test_padded_feature_lists_with_steps_pad_value_and_mask(dataset):
    root, expected = dataset
    batch = next(iter(open_dataset(root, "train", batch_size=6, executor="threads", padded=True, return_mask=True,
                                   pad_value={"t": -1.0, "tags": b"-"})))
    users = batch["user"].tolist()
    steps = np.array([len(expected[u][1]["t"]) for u in users])
    longest = int(steps.max())
    assert batch["t"].shape == (6, longest) and batch["t"].dtype == np.float32
    assert batch["xy"].shape == (6, longest, 2) and batch["clicks"].shape == (6, longest)
    widest = max(len(step) for u in users for step in expected[u][1]["tags"])
    assert batch["tags"].shape == (6, longest, widest)
    for name in LISTS:
        assert batch[f"{name}__steps"].dtype == np.int64 and batch[f"{name}__steps"].tolist() == steps.tolist()
    for row, user in enumerate(users):
        lists = expected[user][1]
        count = len(lists["t"])
        assert batch["t"][row].tolist() == [s[0] for s in lists["t"]] + [-1.0] * (longest - count)
        assert batch["xy"][row].tolist() == lists["xy"] + [[0, 0]] * (longest - count)
        assert batch["t__mask"][row].tolist() == [True] * count + [False] * (longest - count)
        for step, values in enumerate(lists["tags"] + [[]] * (longest - count)):
            assert batch["tags"][row, step].tolist() == values + [b"-"] * (widest - len(values))
            assert batch["tags__mask"][row, step].tolist() == [True] * len(values) + [False] * (widest - len(values))
    # country is a scalar some users lack (shape [] in the manifest): [B] and a [B] mask, as Example features
    assert batch["country"].shape == batch["country__mask"].shape == (6,)
    assert batch["country__mask"].tolist() == ["country" in expected[user][0] for user in users]
    cut = next(iter(open_dataset(root, "train", batch_size=6, executor="threads", padded={"t": 2})))
    assert cut["t"].shape == (6, 2) and cut["t__steps"].tolist() == np.minimum(steps, 2).tolist()
    assert isinstance(cut["xy"], Ragged) and "xy__steps" not in cut


def test_arrow_output_has_list_of_step_columns(dataset):
    root, expected = dataset
    batch = next(iter(open_dataset(root, "train", batch_size=10, executor="threads", output="arrow")))
    assert batch.schema.field("t").type == pa.list_(pa.float32())
    assert batch.schema.field("xy").type == pa.list_(pa.list_(pa.int64(), 2))
    assert batch.schema.field("tags").type == pa.list_(pa.list_(pa.binary()))
    assert batch.schema.field("user").type == pa.int64()
    for row in batch.to_pylist():
        context, lists = expected[row["user"]]
        assert row["xy"] == lists["xy"] and row["tags"] == lists["tags"]
        assert row["t"] == [step[0] for step in lists["t"]]
        assert row["country"] == context.get("country")  # absent: null, as examples_to_record_batch gives it


def test_shuffling_and_resume_behave_as_for_examples(dataset):
    root, expected = dataset
    options = {"batch_size": 4, "shuffle_files": True, "shuffle_buffer": 20, "seed": 3, "executor": "threads"}
    whole = [check_batch(batch, expected) for batch in open_dataset(root, "train", **options)]
    assert sorted(u for batch in whole for u in batch) == list(range(60)) and whole[0] != [0, 1, 2, 3]
    first = open_dataset(root, "train", **options)
    iterator = iter(first)
    seen = [check_batch(next(iterator), expected) for _ in range(5)]
    state = first.state_dict()
    first.close()
    resumed = open_dataset(root, "train", **options)
    resumed.load_state_dict(state)
    rest = [check_batch(batch, expected) for batch in resumed]
    assert seen + rest == whole


def test_processes_and_record_range_shards(dataset):
    root, expected = dataset
    users = []
    for index in range(4):  # more workers than files: record ranges
        shard = open_dataset(root, "train", batch_size=8, executor="processes", num_workers=2).shard(4, index)
        users += [u for batch in shard for u in check_batch(batch, expected)]
        shard.close()
    assert sorted(users) == list(range(60))


def test_random_access_gives_each_records_steps(dataset):
    root, expected = dataset
    source = open_random_access(root, "train")
    assert len(source) == 60
    for record in source.__getitems__([59, 0, 17, 17]):
        context, lists = expected[int(record["user"])]
        assert record["t"].tolist() == [s[0] for s in lists["t"]]
        assert record["xy"].tolist() == lists["xy"] and record["xy"].shape == (len(lists["xy"]), 2)
        assert isinstance(record["tags"], Ragged) and [s.tolist() for s in record["tags"].to_list()] == lists["tags"]
        assert record["country"].tolist() == context.get("country", [])
    assert open_random_access(root, "train", columns=["clicks"])[3].keys() == {"clicks"}


def test_a_glob_needs_record_type_and_the_wrong_one_fails_in_one_line(dataset, tmp_path):
    root, expected = dataset
    pattern = str(root / "train" / "*.tfrecord")
    first = sorted((root / "train").glob("*.tfrecord"))[0]
    for spec in (None, {"user": FixedLenFeature((), "int64")}):
        with pytest.raises(ExampleDecodeError) as info:
            next(iter(open_dataset(pattern, feature_spec=spec, executor="threads")))
        message = str(info.value)
        assert message == (f"{first}: the record at offset 0 is a tf.train.SequenceExample (it has feature_lists), "
                           "not a tf.train.Example: pass record_type='SequenceExample' to read SequenceExamples")
    reader = open_dataset(pattern, record_type="SequenceExample", batch_size=100, executor="threads")
    assert reader.features == open_dataset(root, "train").features | {"country": VarLenFeature("bytes")}
    assert sorted(check_batch(next(iter(reader)), expected)) == list(range(60))
    examples = tmp_path / "examples.tfrecord"
    with RecordWriter(str(examples)) as writer:
        writer.write_many([encode_example({"user": [1]}), encode_example({"user": [2]})])
    for spec in (None, {"t": FixedLenSequenceFeature((), "float")}):
        with pytest.raises(ExampleDecodeError) as info:
            next(iter(open_dataset(str(examples), record_type="SequenceExample", feature_spec=spec, executor="threads")))
        assert str(info.value).startswith(f"{examples}: the record at offset 0 has no feature_lists")
        assert "pass record_type='Example'" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"holds SequenceExample records .* but record_type='Example' was passed"):
        open_dataset(root, "train", record_type="Example")
    with pytest.raises(ConfigError, match=r"features \['t'\] are feature lists .* pass record_type='SequenceExample'"):
        open_dataset(pattern, feature_spec={"t": FixedLenSequenceFeature((), "float")})
    with pytest.raises(ConfigError, match="record_type='Sequence' is not one of"):
        open_dataset(pattern, record_type="Sequence")


def test_a_step_that_does_not_fit_the_spec_names_the_file_offset_record_and_step(tmp_path):
    path = tmp_path / "s.tfrecord"
    records = [encode_sequence_example({}, {"t": [[1.0], [2.0]]}), encode_sequence_example({}, {"t": [[1.0], [2.0, 3.0]]})]
    with RecordWriter(str(path)) as writer:
        writer.write_many(records)
    reader = open_dataset(str(path), record_type="SequenceExample", feature_spec={"t": FixedLenSequenceFeature((), "float")})
    with pytest.raises(ArrowConversionError, match=(
            rf"{path}: the record at offset {len(records[0]) + 16} does not match the feature spec: record 0 of the batch: "
            "feature list 't' holds 2 values in step 1")):
        next(iter(reader))
    assert next(iter(open_dataset(str(path), record_type="SequenceExample")))["t"].values.to_list()[3].tolist() == [2, 3]


def test_tensorflow_written_sequence_examples(tf_vectors):
    path = str(tf_vectors / "sequence_examples.tfrecord")
    records = list(read_records(path))
    spec = {"id": VarLenFeature("int64"), "lang": VarLenFeature("bytes"), "tokens": VarLenSequenceFeature("bytes"),
            "vals": VarLenSequenceFeature("float"), "steps": VarLenSequenceFeature("int64"),
            "nokind_step": VarLenSequenceFeature("int64")}
    (batch,) = open_dataset(path, record_type="SequenceExample", feature_spec=spec, batch_size=10, executor="threads")
    for row, record in enumerate(records):
        context, lists = decode_sequence_example(record)
        assert batch["id"].row(row).tolist() == context.get("id", [])
        for name in ("tokens", "vals", "steps", "nokind_step"):
            got = [step.tolist() for step in batch[name].row(row).to_list()]
            assert with_float32_bits(got) == with_float32_bits(lists.get(name, [])), (row, name)
    assert len(batch["steps"].row(4).lengths) == 100  # TF record 4: a 100-step list


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(users=st.integers(1, 30), seed=st.integers(0, 10), batch_size=st.integers(1, 12), padded=st.booleans())
def test_random_datasets_read_back_as_their_records(tmp_path, users, seed, batch_size, padded):
    root = tmp_path / f"d{users}-{seed}-{batch_size}-{padded}"
    if not root.exists():
        write_dataset(root, users=users, shards=min(3, users), seed=seed)
    records = [read for path in sorted((root / "train").glob("*.tfrecord")) for read in read_records(str(path))]
    expected = {c["user"][0]: (c, lists) for c, lists in map(decode_sequence_example, records)}
    seen = []
    padding = ["t", "tags"] if padded else False
    for batch in open_dataset(root, "train", batch_size=batch_size, executor="threads", padded=padding):
        if padded:
            for row, user in enumerate(batch["user"].tolist()):
                lists = expected[user][1]
                steps = int(batch["t__steps"][row])
                assert steps == len(lists["t"]) and batch["t"][row, :steps].tolist() == [s[0] for s in lists["t"]]
                assert [batch["tags"][row, s, : len(v)].tolist() for s, v in enumerate(lists["tags"])] == lists["tags"]
            seen += batch["user"].tolist()
        else:
            seen += check_batch(batch, expected)
    assert sorted(seen) == list(range(users))


def test_grain_reads_sequence_records(dataset):
    grain = pytest.importorskip("grain")
    root, expected = dataset
    source = open_random_access(root, "train", columns=["user", "t"])
    pad = lambda record: {"user": record["user"], "t": np.pad(record["t"], (0, 9 - len(record["t"])), constant_values=-1)}
    batches = list(grain.MapDataset.source(source).shuffle(seed=1).map(pad).batch(8))
    assert batches[0]["t"].shape == (8, 9)
    users = [int(user) for batch in batches for user in batch["user"].tolist()]
    assert sorted(users) == list(range(60)) and users != list(range(60))
    for batch in batches:
        for user, steps in zip(batch["user"].tolist(), batch["t"].tolist()):
            assert [value for value in steps if value != -1] == [s[0] for s in expected[user][1]["t"]]


def test_torch_adapter_turns_steps_into_tensors(dataset):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional extra: pip install tfrbeam[torch])")
    from tfrbeam.dataset.torch import TorchIterableDataset

    root, _ = dataset
    loader = torch.utils.data.DataLoader(TorchIterableDataset(open_dataset(root, "train", batch_size=16)), batch_size=None)
    for batch in loader:
        assert isinstance(batch["t"].values, torch.Tensor) and isinstance(batch["t"].lengths, torch.Tensor)
        assert isinstance(batch["tags"].values, Ragged) and batch["tags"].values.values.dtype == object


def test_steps_of_zero_values_in_numpy_and_arrow(tmp_path):
    """A fixed step shape of (0,) (and a context feature of shape (0,)): pyarrow's from_arrays divides by 0 there."""
    path = tmp_path / "z.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write_many([encode_sequence_example({"c": []}, {"z": [[], []]}, kinds={"c": "float"},
                                                   feature_list_kinds={"z": "float"})] * 3)
    spec = {"c": FixedLenFeature((0,), "float"), "z": FixedLenSequenceFeature((0,), "float")}
    batch = next(iter(open_dataset(str(path), record_type="SequenceExample", feature_spec=spec, executor="threads")))
    assert batch["c"].shape == (3, 0) and batch["z"].values.shape == (6, 0) and batch["z"].lengths.tolist() == [2, 2, 2]
    arrow = next(iter(open_dataset(str(path), record_type="SequenceExample", feature_spec=spec, output="arrow")))
    assert arrow.to_pylist() == [{"c": [], "z": [[], []]}] * 3
