"""open_random_access: records by number, in the asked order; threads, pickling, errors; real Grain and PyTorch loaders."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import pathlib
import pickle

import numpy as np
import pytest

from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import RandomAccessDataset, VarLenFeature, open_random_access
from tfrbeam.errors import ConfigError, CorruptRecordError, RandomAccessError, ShardMismatchError
from tfrbeam.tfrecord.read_index import index_path_for, offsets_from_headers, read_index_bytes
from tfrbeam.tfrecord.records import RecordWriter

SIZES = [70, 0, 95, 35]  # an empty shard in the middle
TOTAL = sum(SIZES)


def make_record(record_id: int) -> bytes:
    return encode_example(
        {"id": record_id, "vec": [float(record_id)] * 3, "tags": [b"t"] * (record_id % 3), "name": f"r{record_id}"},
        kinds={"tags": "bytes"},
    )


def build(root: pathlib.Path, compression: str | None = None) -> pathlib.Path:
    """A dataset directory with split "train" (shards of SIZES records, ids consecutive) and its manifest."""
    root.mkdir(parents=True, exist_ok=True)
    shards, next_id = [], 0
    suffix = ".gz" if compression else ""
    for number, size in enumerate(SIZES):
        path = root / f"train-{number:05d}-of-{len(SIZES):05d}.tfrecord{suffix}"
        with RecordWriter(str(path), compression) as writer:
            for _ in range(size):
                writer.write(make_record(next_id))
                next_id += 1
        shards.append({"path": path.name, "num_examples": size, "num_bytes": path.stat().st_size})
    manifest = {
        "format": "tfrbeam-dataset/1", "compression": compression,
        "splits": {"train": {"num_examples": TOTAL, "num_bytes": 0, "shards": shards}},
        "features": {"id": {"type": "int64", "shape": [], "always_present": True},
                     "vec": {"type": "float", "shape": [3], "always_present": True},
                     "tags": {"type": "bytes", "shape": None, "always_present": False},
                     "name": {"type": "bytes", "shape": [], "always_present": True}},
    }
    (root / "tfrbeam_dataset.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture()
def dataset_dir(tmp_path) -> pathlib.Path:
    return build(tmp_path / "ds")


def test_records_by_number_in_manifest_order_and_in_the_asked_order(dataset_dir):
    source = open_random_access(dataset_dir, "train")
    assert isinstance(source, RandomAccessDataset) and len(source) == TOTAL
    assert "200 records in 4 shards" in repr(source) and "features=['id', 'vec', 'tags', 'name']" in repr(source)
    record = source[7]
    assert (
        record["id"] == 7
        and record["vec"].tolist() == [7.0] * 3
        and record["tags"].tolist() == [b"t"]
        and record["name"] == b"r7"
    )
    assert source[-1]["id"] == TOTAL - 1 and source[0]["tags"].tolist() == []
    asked = [199, 3, 70, 3, 164, 0, 69, 165]
    assert [int(item["id"]) for item in source.__getitems__(asked)] == asked
    assert [int(item["id"]) for item in source[10:13]] == [10, 11, 12]
    with pytest.raises(IndexError, match="record index 200 is out of range for 200 records"):
        source[200]
    with pytest.raises(IndexError):
        source.__getitems__([1, -201])


def test_columns_raw_and_a_glob(dataset_dir):
    only = open_random_access(dataset_dir, "train", columns=["id"])
    assert only[5] == {"id": 5}
    raw = open_random_access(dataset_dir, "train", raw=True)
    assert raw[71] == make_record(71) and raw.__getitems__([2, 1]) == [make_record(2), make_record(1)]
    globbed = open_random_access(str(dataset_dir / "*.tfrecord"), feature_spec={"id": "int64", "tags": VarLenFeature("bytes")})
    assert len(globbed) == TOTAL and int(globbed[150]["id"][0]) == 150
    with pytest.raises(ConfigError, match="not features"):
        open_random_access(dataset_dir, "train", columns=["nope"])


def test_one_decode_per_batch(dataset_dir, monkeypatch):
    import tfrbeam.dataset.reader as reader_module

    calls: list[int] = []
    original = reader_module.examples_to_record_batch
    monkeypatch.setattr(
        reader_module,
        "examples_to_record_batch",
        lambda records, schema, **options: calls.append(len(records[1])) or original(records, schema, **options),
    )
    source = open_random_access(dataset_dir, "train")
    source.__getitems__(list(range(0, TOTAL, 3)))
    assert calls == [len(range(0, TOTAL, 3))]  # one call across all shards


def test_threads_share_one_object(dataset_dir):
    source = open_random_access(dataset_dir, "train", columns=["id"])
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, TOTAL, 64).tolist() for _ in range(64)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(source.__getitems__, batches))
    assert all([int(item["id"]) for item in got] == asked for got, asked in zip(results, batches))


def test_pickling_reopens_the_shards(dataset_dir):
    source = open_random_access(dataset_dir, "train")
    assert source[100]["id"] == 100  # opens a shard
    copy = pickle.loads(pickle.dumps(source))
    assert "_open" not in pickle.loads(pickle.dumps(source)).__getstate__()
    assert copy[100]["id"] == 100 and copy[5]["name"] == b"r5" and len(copy) == TOTAL


def test_compressed_shards_are_refused_clearly(tmp_path):
    root = build(tmp_path / "gz", compression="gzip")
    with pytest.raises(RandomAccessError, match="gzip-compressed: random access needs uncompressed shards"):
        open_random_access(root, "train")


def test_the_read_index_is_built_on_first_use_then_reused(dataset_dir, monkeypatch):
    import tfrbeam.tfrecord.read_index as index_module

    shard = dataset_dir / "train-00002-of-00004.tfrecord"
    assert not pathlib.Path(index_path_for(str(shard))).exists()
    open_random_access(dataset_dir, "train")[100]
    assert pathlib.Path(index_path_for(str(shard))).exists()
    walks: list[str] = []
    monkeypatch.setattr(index_module, "offsets_from_headers", lambda path: walks.append(path) or offsets_from_headers(path))
    assert open_random_access(dataset_dir, "train")[100]["id"] == 100
    assert walks == []


def test_a_forged_read_index_is_ignored_with_a_warning(dataset_dir, caplog):
    shard = dataset_dir / "train-00000-of-00004.tfrecord"
    offsets = offsets_from_headers(str(shard))
    forged = np.delete(offsets, 5)  # record 5 left out: the size still matches
    index_path = pathlib.Path(index_path_for(str(shard)))
    index_path.parent.mkdir(exist_ok=True)
    index_path.write_bytes(read_index_bytes(forged, shard.stat().st_mtime))
    caplog.set_level(logging.WARNING)
    source = open_random_access(dataset_dir, "train", columns=["id"])
    assert [int(source[i]["id"]) for i in range(70)] == list(range(70))
    messages = [record.getMessage() for record in caplog.records if "ignoring the read index" in record.getMessage()]
    assert len(messages) == 1 and str(index_path) in messages[0] and str(shard) in messages[0]


def test_shards_that_disagree_with_the_manifest_or_are_damaged(dataset_dir):
    shard = dataset_dir / "train-00002-of-00004.tfrecord"
    data = shard.read_bytes()
    second = int(offsets_from_headers(str(shard))[1])
    shard.write_bytes(data[:-40])
    with pytest.raises(ShardMismatchError, match=r"train-00002-of-00004\.tfrecord: the manifest says"):
        open_random_access(dataset_dir, "train")[100]
    damaged = bytearray(data)
    damaged[second + 20] ^= 0xFF  # inside record 1's payload
    shard.write_bytes(bytes(damaged))
    source = open_random_access(dataset_dir, "train")
    assert source[70]["id"] == 70
    with pytest.raises(
        CorruptRecordError,
        match=rf"train-00002-of-00004.tfrecord: data CRC mismatch .* at offset {second} \(record 1 of the shard\)",
    ):
        source.__getitems__([72, 71])


# ------------------------------------------------------------------------------------- Grain


def test_grain_map_dataset_shuffled_batches_give_every_record_once_per_epoch(dataset_dir):
    grain = pytest.importorskip("grain")
    source = open_random_access(dataset_dir, "train", columns=["id", "vec"])
    epochs = []
    for seed in (1, 2):
        batches = list(grain.MapDataset.source(source).shuffle(seed=seed).batch(16))
        assert batches[0]["vec"].shape == (16, 3)
        epochs.append([int(value) for batch in batches for value in batch["id"].tolist()])
        assert sorted(epochs[-1]) == list(range(TOTAL))
    assert epochs[0] != epochs[1] and epochs[0] != list(range(TOTAL))


def _loader(grain, source, workers: int):
    sampler = grain.samplers.IndexSampler(
        num_records=len(source), shard_options=grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=7,
    )
    return grain.DataLoader(
        data_source=source, sampler=sampler, operations=[grain.transforms.Batch(batch_size=10)], worker_count=workers
    )


def test_grain_data_loader_with_two_worker_processes_and_a_checkpoint_restored_mid_epoch(dataset_dir):
    grain = pytest.importorskip("grain")
    source = open_random_access(dataset_dir, "train", columns=["id"])
    whole = [int(value) for batch in _loader(grain, source, 2) for value in batch["id"].tolist()]
    assert sorted(whole) == list(range(TOTAL))
    iterator = iter(_loader(grain, source, 2))
    head = [int(value) for _ in range(7) for value in next(iterator)["id"].tolist()]
    state = iterator.get_state()
    del iterator
    resumed = iter(_loader(grain, source, 2))
    resumed.set_state(state)
    rest = [int(value) for batch in resumed for value in batch["id"].tolist()]
    assert head + rest == whole and len(head) == 70


# ------------------------------------------------------------------------------------ PyTorch


def test_pytorch_data_loader_over_the_map_style_object(dataset_dir):
    torch = pytest.importorskip("torch", reason="torch is not installed (not a test dependency)")
    source = open_random_access(dataset_dir, "train", columns=["id", "vec"])
    loader = torch.utils.data.DataLoader(source, batch_size=16, shuffle=True, num_workers=2,
                                         generator=torch.Generator().manual_seed(0))
    ids = []
    for batch in loader:
        assert isinstance(batch["id"], torch.Tensor) and batch["vec"].shape[1:] == (3,)
        ids += batch["id"].tolist()
    assert sorted(ids) == list(range(TOTAL))
