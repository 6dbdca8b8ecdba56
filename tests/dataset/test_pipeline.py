"""tfrbeam.dataset: exactly-once reading under parallelism, shuffling, sharding and resume; outputs; errors."""

from __future__ import annotations

import json
import math
import pathlib
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tfrbeam.codec.example import decode_example, encode_example
from tfrbeam.dataset import FixedLenFeature, Ragged, VarLenFeature, open_dataset
from tfrbeam.errors import ArrowConversionError, ConfigError, CorruptRecordError, ExampleDecodeError, TruncatedRecordError
from tfrbeam.tfrecord.read_index import ReadIndexBuilder, index_path_for
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, RecordWriter

FEATURE_KINDS = {"tags": "bytes", "opt": "int64"}


def make_record(record_id: int) -> bytes:
    """Record ``record_id``: a scalar id, a fixed float[3], variable tags, a name, and ``opt`` on every third record only."""
    features = {
        "id": record_id,
        "x": [float(record_id), record_id / 2.0, -1.0],
        "tags": [b"t" * (1 + (record_id + j) % 3) for j in range(record_id % 4)],
        "name": f"n{record_id}",
    }
    if record_id % 3 == 0:
        features["opt"] = [record_id, record_id + 1]
    return encode_example(features, kinds=FEATURE_KINDS)


def write_files(
    directory: pathlib.Path, sizes: list[int], compression: str | None = None, index_interval: int | None = None
) -> list[str]:
    """One TFRecord file per entry of ``sizes`` with consecutive record ids; optionally a read index beside each."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    next_id = 0
    suffix = ".tfrecord.gz" if compression == "gzip" else ".tfrecord"
    for number, size in enumerate(sizes):
        path = directory / f"part-{number:03d}{suffix}"
        builder = ReadIndexBuilder(index_interval) if index_interval else None
        with RecordWriter(str(path), compression) as writer:
            for _ in range(size):
                payload = make_record(next_id)
                if builder is not None:
                    builder.add(writer.bytes_written, writer.records_written)
                writer.write(payload)
                next_id += 1
        if builder is not None:
            index_file = pathlib.Path(index_path_for(str(path)))
            index_file.parent.mkdir(exist_ok=True)
            stat = path.stat()
            index_file.write_bytes(builder.to_bytes(stat.st_size, stat.st_mtime))
        paths.append(str(path))
    return paths


SPEC = {
    "id": FixedLenFeature((), "int64"),
    "x": FixedLenFeature((3,), "float"),
    "tags": VarLenFeature("bytes"),
    "name": FixedLenFeature((), "bytes"),
    "opt": VarLenFeature("int64"),
}


def check_rows(batch: dict) -> None:
    """Every row's features belong to its id (catches rows mixed up by the shuffle buffer or sharding)."""
    ids = batch["id"].tolist()
    if "name" in batch:
        assert batch["name"].tolist() == [f"n{i}".encode() for i in ids]
    if "x" in batch:
        np.testing.assert_array_equal(batch["x"], np.array([[i, i / 2.0, -1.0] for i in ids], dtype=np.float32))
    if "tags" in batch:
        assert [row.tolist() for row in batch["tags"].to_list()] == [
            [b"t" * (1 + (i + j) % 3) for j in range(i % 4)] for i in ids
        ]
    if "opt" in batch:
        assert [row.tolist() for row in batch["opt"].to_list()] == [[i, i + 1] if i % 3 == 0 else [] for i in ids]


def ids_of(dataset, check: bool = True) -> list[int]:
    """The record ids in the order the dataset yields them, checking each batch's rows on the way."""
    out: list[int] = []
    for batch in dataset:
        if check:
            check_rows(batch)
        out += batch["id"].tolist()
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("dataset")
    write_files(directory, [40, 0, 27, 55, 13])
    return directory


TOTAL = 40 + 27 + 55 + 13


# ------------------------------------------------------------------------------------ values


def test_values_match_the_records_and_the_inferred_spec(files):
    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=16, executor="threads")
    assert dataset.features == {
        "id": FixedLenFeature((), "int64"),
        "name": FixedLenFeature((), "bytes"),
        "opt": VarLenFeature("int64"),
        "tags": VarLenFeature("bytes"),
        "x": FixedLenFeature((3,), "float"),
    }
    seen = 0
    for batch in dataset:
        assert batch["id"].dtype == np.int64 and batch["x"].dtype == np.float32 and batch["x"].shape == (len(batch["id"]), 3)
        assert isinstance(batch["tags"], Ragged) and isinstance(batch["opt"], Ragged)
        tags, opts = batch["tags"].to_list(), batch["opt"].to_list()
        for row, record_id in enumerate(batch["id"].tolist()):
            expected = decode_example(make_record(record_id))
            assert batch["name"][row] == expected["name"][0]
            assert batch["x"][row].tolist() == pytest.approx(expected["x"])
            assert tags[row].tolist() == expected["tags"]
            assert opts[row].tolist() == expected.get("opt", [])
        seen += len(batch["id"])
    assert seen == TOTAL


def test_unshuffled_order_is_the_file_order_with_one_slot(files):
    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=10, num_parallel_reads=1, executor="threads")
    assert ids_of(dataset) == list(range(TOTAL))


def test_columns_padding_and_arrow_output(files):
    dataset = open_dataset(str(files / "*.tfrecord"), feature_spec=SPEC, columns=["tags", "id"], padded={"tags": 2},
                           batch_size=8, num_parallel_reads=1, executor="threads")
    batch = next(iter(dataset))
    assert sorted(batch) == ["id", "tags"]
    assert batch["tags"].shape == (8, 2)
    assert batch["tags"][3].tolist() == [b"t", b"tt"] and batch["tags"][0].tolist() == [b"", b""]
    arrow = next(iter(open_dataset(str(files / "*.tfrecord"), feature_spec=SPEC, output="arrow", batch_size=5,
                                    num_parallel_reads=1, executor="threads")))
    assert isinstance(arrow, pa.RecordBatch)
    assert arrow.schema.field("x").type == pa.list_(pa.float32(), 3)
    assert arrow.schema.field("tags").type == pa.list_(pa.binary())
    assert arrow.column("opt").to_pylist() == [[0, 1], None, None, [3, 4], None]  # absent: null (issue 24)
    assert arrow.column("name").to_pylist() == [b"n0", b"n1", b"n2", b"n3", b"n4"]


def test_multi_dimensional_and_fixed_length_bytes_features(tmp_path):
    path = str(tmp_path / "m.tfrecord")
    with RecordWriter(path) as writer:
        for number in range(5):
            writer.write(encode_example({"m": [float(number)] * 6, "pair": [b"x%d" % number, b"y"]}))
    spec = {"m": FixedLenFeature((2, 3), "float"), "pair": FixedLenFeature((2,), "bytes")}
    batch = next(iter(open_dataset(path, feature_spec=spec, batch_size=5, shuffle_buffer=5, seed=1, executor="threads")))
    assert batch["m"].shape == (5, 2, 3) and batch["pair"].shape == (5, 2)
    assert [row.tolist() for row in batch["pair"]] == [[b"x%d" % m[0, 0], b"y"] for m in batch["m"]]
    arrow = next(iter(open_dataset(path, feature_spec=spec, batch_size=2, output="arrow", executor="threads")))
    assert arrow.schema.field("m").type == pa.list_(pa.list_(pa.float32(), 3), 2)
    assert arrow.column("pair").to_pylist() == [[b"x0", b"y"], [b"x1", b"y"]]


def test_a_missing_fixed_feature_uses_its_default_or_names_the_file_and_offset(files):
    spec = dict(SPEC, opt=FixedLenFeature((2,), "int64", default_value=[-7, -8]))
    batch = next(
        iter(open_dataset(str(files / "*.tfrecord"), feature_spec=spec, batch_size=4, num_parallel_reads=1, executor="threads"))
    )
    assert batch["opt"].tolist() == [[0, 1], [-7, -8], [-7, -8], [3, 4]]
    spec = dict(SPEC, opt=FixedLenFeature((2,), "int64"))
    with pytest.raises((ExampleDecodeError, ArrowConversionError), match=r"part-000\.tfrecord: the record at offset \d+"):
        list(open_dataset(str(files / "*.tfrecord"), feature_spec=spec, batch_size=4, executor="threads"))


def test_drop_remainder_and_len_from_a_manifest(tmp_path):
    write_files(tmp_path / "data", [30, 25])
    manifest = {
        "format": "tfrbeam-dataset/1",
        "splits": {
            "train": {"num_examples": 30, "num_bytes": 0, "shards": [{"path": "data/part-000.tfrecord", "num_examples": 30}]},
            "eval": {"num_examples": 25, "num_bytes": 0, "shards": [{"path": "data/part-001.tfrecord", "num_examples": 25}]},
        },
        "compression": None,
        "features": {
            "id": {"type": "int64", "shape": [], "always_present": True},
            "x": {"type": "float", "shape": [3], "always_present": True},
            "opt": {"type": "int64", "shape": [2], "always_present": False},
        },
    }
    (tmp_path / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="pass split="):
        open_dataset(tmp_path)
    train = open_dataset(tmp_path, "train", batch_size=7, executor="threads")
    assert train.num_records == 30 and len(train) == 5 and len(train.repeat(3).take(11)) == 11
    assert ids_of(train) == list(range(30))
    assert train.features["opt"] == VarLenFeature("int64")
    evaluation = open_dataset(tmp_path, split="eval", batch_size=7, drop_remainder=True, executor="threads")
    batches = list(evaluation)
    assert len(batches) == len(evaluation) == 3 and all(len(batch["id"]) == 7 for batch in batches)
    with pytest.raises(ConfigError, match="no split 'test'"):
        open_dataset(tmp_path, split="test")


# ------------------------------------------------------------------------ exactly once, order


@st.composite
def configurations(draw):
    return {
        "sizes": draw(st.lists(st.integers(0, 30), min_size=1, max_size=5)),
        "batch_size": draw(st.integers(1, 13)),
        "num_parallel_reads": draw(st.integers(1, 4)),
        "block_length": draw(st.integers(1, 9)),
        "shuffle_files": draw(st.booleans()),
        "shuffle_buffer": draw(st.sampled_from([0, 0, 2, 7, 50, 1000])),
        "seed": draw(st.integers(0, 2**32)),
        "num_workers": draw(st.integers(1, 3)),
        "shards": draw(st.integers(1, 4)),
        "by": draw(st.sampled_from(["auto", "file", "record"])),
        "indexed": draw(st.booleans()),
        "resume_at": draw(st.integers(0, 12)),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=configurations())
def test_every_record_once_deterministic_and_resumable(config):
    root = pathlib.Path(tempfile.mkdtemp())
    try:
        write_files(root, config["sizes"], index_interval=200 if config["indexed"] else None)
        options = {key: config[key] for key in ("batch_size", "num_parallel_reads", "block_length", "shuffle_files",
                                                 "shuffle_buffer", "seed", "num_workers")}

        def shard(index: int):
            dataset = open_dataset(str(root / "*.tfrecord"), feature_spec=SPEC, executor="threads", **options)
            return dataset.shard(config["shards"], index, by=config["by"])

        union: list[int] = []
        for index in range(config["shards"]):
            first = ids_of(shard(index))
            assert ids_of(shard(index)) == first  # same seed, same order
            union += first
            resumed = shard(index)
            iterator = iter(resumed)
            stop_after = min(config["resume_at"], math.ceil(len(first) / config["batch_size"]))
            head = [int(v) for _, batch in zip(range(stop_after), iterator) for v in batch["id"]]
            state = resumed.state_dict()
            iterator.close()
            again = shard(index)
            again.load_state_dict(state)
            assert head + ids_of(again) == first
        assert sorted(union) == list(range(sum(config["sizes"])))
    finally:
        shutil.rmtree(root)


def test_epochs_reshuffle_and_repeat_take_and_iterating_again(files):
    dataset = open_dataset(
        str(files / "*.tfrecord"), batch_size=9, shuffle_files=True, shuffle_buffer=64, seed=3, executor="threads"
    )
    epochs = ids_of(dataset.repeat(3))
    assert len(epochs) == 3 * TOTAL
    first, second, third = epochs[:TOTAL], epochs[TOTAL:2 * TOTAL], epochs[2 * TOTAL:]
    assert sorted(first) == sorted(second) == sorted(third) == list(range(TOTAL))
    assert first != second != third
    again = open_dataset(
        str(files / "*.tfrecord"), batch_size=9, shuffle_files=True, shuffle_buffer=64, seed=3, executor="threads"
    )
    assert ids_of(again) == first and ids_of(again) == second  # each pass is the next epoch
    taken = open_dataset(str(files / "*.tfrecord"), batch_size=9, executor="threads").take(4)
    assert len(list(taken)) == 4


def test_breaking_off_a_pass_and_iterating_again_reads_the_next_epoch_whole(files):
    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=8, shuffle_buffer=40, seed=4, executor="threads")
    iterator = iter(dataset)
    next(iterator)
    next(iterator)
    second = ids_of(dataset)  # the abandoned pass is closed; this one is epoch 1, complete
    reference = open_dataset(str(files / "*.tfrecord"), batch_size=8, shuffle_buffer=40, seed=4, executor="threads")
    assert ids_of(reference.repeat(2))[TOTAL:] == second


def test_resume_across_an_epoch_boundary_of_a_repeated_pass(files):
    def make():
        return open_dataset(str(files / "*.tfrecord"), batch_size=10, shuffle_buffer=30, seed=5, executor="threads").repeat(2)

    whole = ids_of(make())
    stopped = make()
    iterator = iter(stopped)
    head = [int(v) for _, batch in zip(range(17), iterator) for v in batch["id"]]
    state = stopped.state_dict()
    assert state["epoch"] == 1  # 14 batches per epoch
    iterator.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + ids_of(resumed) == whole


def test_nondeterministic_mode_still_reads_every_record_once(files):
    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=8, deterministic=False, num_parallel_reads=3,
                           num_workers=3, shuffle_buffer=20, executor="threads")
    assert sorted(ids_of(dataset)) == list(range(TOTAL))
    with pytest.raises(ConfigError, match="deterministic=True"):
        dataset.state_dict()


def test_autotune_moves_decode_parallelism_and_prefetch_depth(files):
    import queue

    from tfrbeam.dataset.passes import Tuner

    dataset = open_dataset(str(files / "*.tfrecord"), num_parallel_reads=3, num_workers=3, executor="threads")
    workers = dataset._get_workers()
    prefetch: queue.Queue = queue.Queue(2)
    tuner = Tuner(lambda: workers, dataset.stats, prefetch, now=0.0)
    prefetch.put(1)
    prefetch.put(2)
    tuner.observe(0.0, now=1.5)  # the caller never waits and batches pile up: give a worker back
    assert workers.limit.allowed == 2
    tuner.observe(0.5, now=3.0)  # the caller waits a third of the time: more parallelism first
    assert workers.limit.allowed == 3 and prefetch.maxsize == 2
    tuner.observe(0.5, now=4.5)  # still waiting with every worker busy: deeper prefetch
    assert prefetch.maxsize == 4
    assert dataset.stats["workers_allowed"] == 3 and dataset.stats["prefetch"] == 4
    dataset.close()


def test_a_state_from_another_configuration_is_refused(files):
    one = open_dataset(str(files / "*.tfrecord"), batch_size=8, seed=1, executor="threads")
    other = open_dataset(str(files / "*.tfrecord"), batch_size=9, seed=1, executor="threads")
    with pytest.raises(ConfigError, match="same arguments"):
        other.load_state_dict(one.state_dict())


def test_shuffle_buffer_of_the_dataset_size_decorrelates_position(tmp_path):
    write_files(tmp_path, [2000])
    dataset = open_dataset(str(tmp_path / "*.tfrecord"), feature_spec=SPEC, columns=["id"], batch_size=100,
                           shuffle_buffer=2000, seed=11, executor="threads")
    order = np.array(ids_of(dataset))
    assert sorted(order.tolist()) == list(range(2000))
    correlation = np.corrcoef(np.arange(2000), order)[0, 1]
    assert abs(correlation) < 0.1
    # A small buffer (fed small blocks) keeps records near their position: the correlation stays high.
    local = np.array(ids_of(open_dataset(str(tmp_path / "*.tfrecord"), feature_spec=SPEC, batch_size=10,
                                         shuffle_buffer=20, block_length=10, seed=11, executor="threads")))
    assert np.corrcoef(np.arange(2000), local)[0, 1] > 0.99


def test_record_range_shards_seek_with_the_read_index(tmp_path, monkeypatch):
    write_files(tmp_path, [300, 200], index_interval=1000)
    walked: list[int] = []
    import tfrbeam.dataset.reader as reader_module

    original = reader_module.offset_of_record
    monkeypatch.setattr(
        reader_module, "offset_of_record", lambda path, offset, count: walked.append(count) or original(path, offset, count)
    )
    union = []
    for index in range(5):
        shard = open_dataset(str(tmp_path / "*.tfrecord"), feature_spec=SPEC, batch_size=16, executor="threads").shard(5, index)
        ids = ids_of(shard)
        assert len(ids) == 100 and len(shard) == math.ceil(100 / 16)
        union += ids
    assert sorted(union) == list(range(500))
    record_size = len(make_record(0)) + RECORD_OVERHEAD
    assert walked and max(walked) < 1000 // record_size + 2  # never walked from a file's start past an index entry


def test_gzip_files_and_processes(tmp_path):
    write_files(tmp_path, [50, 31], compression="gzip")

    def make(executor: str):
        return open_dataset(str(tmp_path / "*.tfrecord.gz"), batch_size=8, shuffle_buffer=25, seed=2,
                            executor=executor, num_workers=2)

    threads = make("threads")
    whole = ids_of(threads)
    assert sorted(whole) == list(range(81))
    stopped = make("threads")
    iterator = iter(stopped)
    head = [int(v) for _, batch in zip(range(4), iterator) for v in batch["id"]]
    state = stopped.state_dict()
    iterator.close()
    with make("processes") as processes:
        assert ids_of(processes) == whole  # the order does not depend on the executor
        assert processes.stats["executor"] == "processes"
        processes.load_state_dict(state)  # and a position saved with threads resumes with processes
        assert head + ids_of(processes) == whole
        import os
        import signal

        os.kill(processes._workers._processes[0].pid, signal.SIGKILL)
        processes._workers._processes[0].wait()
        with pytest.raises(RuntimeError, match="reader process 0 exited unexpectedly"):
            ids_of(processes)  # a worker that dies is an error, not a hang


# ----------------------------------------------------------------- TensorFlow-written files


def _feature_values(feature: dict) -> list:
    kind = feature["kind"]
    if kind == "int64_list":
        return feature["values"]
    if kind == "float_list":
        return [float.fromhex(value) for value in feature["values_hex"]]
    import base64

    return [base64.b64decode(value) for value in feature["values_b64"]]


@pytest.mark.parametrize("name", ["examples.tfrecord", "examples.tfrecord.gz"])
def test_reads_the_tensorflow_written_examples(tf_vectors, name):
    expected = json.loads((tf_vectors / "examples.json").read_text())["examples"]
    kinds: dict[str, set] = {}
    for example in expected:
        for feature in example["features"]:
            kinds.setdefault(feature["name"], set()).add(feature["kind"])
    usable = {name: kind.pop() for name, kind in kinds.items() if len(kind) == 1 and None not in kind}
    usable = dict(list(usable.items())[:200])  # the 1000-feature record needs no more to be proven
    dtype = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}
    spec = {name: VarLenFeature(dtype[kind]) for name, kind in usable.items()}
    dataset = open_dataset(str(tf_vectors / name), feature_spec=spec, batch_size=1, executor="threads")
    batches = list(dataset)
    assert len(batches) == len(expected) == 20
    for example, batch in zip(expected, batches):
        present = {feature["name"]: feature for feature in example["features"]}
        for feature_name in usable:
            values = batch[feature_name].values.tolist()
            if (
                feature_name in present
                and present[feature_name]["values_b64" if usable[feature_name] == "bytes_list" else "kind"] is not None
            ):
                want = _feature_values(present[feature_name])
                if usable[feature_name] == "float_list":
                    np.testing.assert_array_equal(np.array(values, np.float32), np.array(want, np.float32))
                else:
                    assert values == want, (example["index"], feature_name)
            elif feature_name not in present:
                assert values == []


@pytest.mark.parametrize("name", ["raw.tfrecord", "raw.tfrecord.gz", "raw.tfrecord.zlib"])
def test_reads_tensorflow_raw_records_as_bytes(tf_vectors, name):
    import hashlib

    expected = json.loads((tf_vectors / "expected.json").read_text())["records"]
    dataset = open_dataset(str(tf_vectors / name), raw=True, batch_size=3, executor="threads")
    records = [record for batch in dataset for record in batch["record"]]
    assert [hashlib.sha256(record).hexdigest() for record in records] == [entry["sha256"] for entry in expected]


@pytest.mark.parametrize(
    ("name", "error", "offset", "kept"),
    [
        ("corrupt_a_data_crc_bitflip.tfrecord", CorruptRecordError, 164, 19),
        ("corrupt_b_length_crc_bitflip.tfrecord", CorruptRecordError, 164, 19),
        ("corrupt_c_payload_bitflip.tfrecord", CorruptRecordError, 164, 19),
        ("corrupt_e_trunc_in_last_payload.tfrecord", TruncatedRecordError, 1078023, 19),
        ("corrupt_g_gzip_truncated.tfrecord.gz", TruncatedRecordError, None, 11),
    ],
)
def test_corrupt_files_raise_with_file_and_offset_or_skip_and_count(tf_vectors, name, error, offset, kept):
    path = str(tf_vectors / name)
    with pytest.raises(error) as raised:
        list(open_dataset(path, raw=True, batch_size=4, executor="threads"))
    assert raised.value.path == path
    if offset is not None:
        assert raised.value.offset == offset
    dataset = open_dataset(path, raw=True, batch_size=4, skip_corrupt=True, executor="threads")
    records = [record for batch in dataset for record in batch["record"]]
    assert len(records) == kept
    assert dataset.skipped and all(region.path == path for region in dataset.skipped)
    if offset is not None:
        assert [region.offset for region in dataset.skipped] == [offset]


# ------------------------------------------------------------------------------- adapters


def test_torch_adapter(files):
    torch = pytest.importorskip("torch", reason="torch is not installed (optional extra: pip install tfrbeam[torch])")
    from tfrbeam.dataset.torch import TorchIterableDataset

    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=16, executor="threads")
    loader = torch.utils.data.DataLoader(TorchIterableDataset(dataset), batch_size=None)
    ids = []
    for batch in loader:
        assert isinstance(batch["id"], torch.Tensor) and batch["x"].dtype == torch.float32
        assert isinstance(batch["opt"].values, torch.Tensor)
        ids += batch["id"].tolist()
    assert sorted(ids) == list(range(TOTAL))


def test_importing_the_reader_does_not_import_beam():
    import subprocess
    import sys

    code = "import sys, tfrbeam.dataset; print('apache_beam' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_reads_what_tfrbeam_build_writes(tmp_path, monkeypatch):
    build = pytest.importorskip("tfrbeam.cli.build", reason="the build pipeline is not importable")
    from tfrbeam.cli.demo_data import write_demo_data

    monkeypatch.chdir(tmp_path)
    write_demo_data("demo_data", 600)
    config = pathlib.Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"
    assert build.main([str(config), "--set", f"output.path={tmp_path / 'out'}"]) == 0
    info = json.loads((tmp_path / "out" / "tfrbeam_dataset.json").read_text())
    for split, entry in info["splits"].items():
        dataset = open_dataset(tmp_path / "out", split, batch_size=32, shuffle_files=True, shuffle_buffer=100, seed=0)
        assert dataset.num_records == entry["num_examples"] and len(dataset) == math.ceil(entry["num_examples"] / 32)
        assert isinstance(dataset.features["tailnum"], VarLenFeature)  # some rows omit it
        flights = [flight for batch in dataset for flight in batch["flight_id"].tolist()]
        assert len(flights) == len(set(flights)) == entry["num_examples"]
        union = []
        for index in range(7):  # more workers than files: record ranges, seeking with the build's read index
            shard = open_dataset(tmp_path / "out", split, batch_size=32).shard(7, index)
            union += [flight for batch in shard for flight in batch["flight_id"].tolist()]
        assert sorted(union) == sorted(flights)


def test_a_saved_position_resumes_on_a_copy_of_the_dataset(files, tmp_path):
    shutil.copytree(files, tmp_path / "copy")
    original = open_dataset(str(files / "*.tfrecord"), batch_size=8, shuffle_buffer=30, seed=9, executor="threads")
    whole = ids_of(open_dataset(str(files / "*.tfrecord"), batch_size=8, shuffle_buffer=30, seed=9, executor="threads"))
    iterator = iter(original)
    head = [int(v) for _, batch in zip(range(5), iterator) for v in batch["id"]]
    state = original.state_dict()
    iterator.close()
    copy = open_dataset(str(tmp_path / "copy" / "*.tfrecord"), batch_size=8, shuffle_buffer=30, seed=9, executor="threads")
    copy.load_state_dict(state)
    assert head + ids_of(copy) == whole


def test_a_replaced_pass_raises_and_leaves_the_position_alone(files):
    """iter(dataset) again closes the earlier pass: its next() says so (no stale batch, no hang)."""
    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=10, num_parallel_reads=1, executor="threads")
    first = iter(dataset)
    next(first)
    second = iter(dataset)
    position = dataset.state_dict()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="replaced it"):
            next(first)
    assert dataset.state_dict() == position
    assert len(next(second)["id"]) == 10
    dataset.close()


def test_a_dropped_pass_stops_its_thread(files):
    import gc

    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=2, prefetch=1, executor="threads")
    it = iter(dataset)
    next(it)
    thread = it._producer.thread
    del it
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()
    dataset.close()


def test_state_dict_reads_the_shard_sizes_once(files, monkeypatch):
    import tfrbeam.dataset.pipeline as dataset_pipeline

    sizes = []
    real_size = dataset_pipeline.input_size  # the public helper that sizes a local file or an object
    monkeypatch.setattr(dataset_pipeline, "input_size", lambda path: sizes.append(path) or real_size(path))
    dataset = open_dataset(str(files / "*.tfrecord"), batch_size=10, executor="threads")
    first = dataset.state_dict()
    assert dataset.state_dict() == first and len(sizes) == len(dataset.segments)
    dataset.load_state_dict(first)  # the same dataset accepts its own state
    assert len(sizes) == len(dataset.segments)
    dataset.close()
