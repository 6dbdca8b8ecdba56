"""One reader semantics: a feature an Example lacks is null in every Arrow output; a present empty list stays []."""

from __future__ import annotations

import glob
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tfrbeam
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.main import main as tfrbeam_main
from tfrbeam.dataset.columns import ShufflePool, concat_blocks, slice_block, take_block
from tfrbeam.dataset.output import to_arrow
from tfrbeam.dataset.reader import ID_KEY, BlockDecoder
from tfrbeam.dataset.spec import VarLenFeature
from tfrbeam.tfrecord.blocks import RecordBlock
from tfrbeam.tfrecord.records import read_records

# Per row: tags (None: the Example lacks the feature; []: it holds an empty int64 list), name (None: absent).
TAGS = [[1, 2], None, [], [3], None, [], [4, 5, 6], None]
NAMES = [b"a", None, b"c", None, b"e", b"f", None, b"h"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    """A build whose Examples omit tags in rows 1, 4, 7 (and hold it empty in 2, 5) and name in rows 1, 3, 6."""
    root = tmp_path_factory.mktemp("absent")
    table = pa.table({"id": list(range(len(TAGS))), "tags": pa.array(TAGS, pa.list_(pa.int64())),
                      "name": pa.array(NAMES, pa.binary())})
    pq.write_table(table, root / "in.parquet")
    (root / "build.yaml").write_text(
        f'input: {{format: parquet, path: "{root / "in.parquet"}"}}\n'
        "features:\n  id: {type: int64}\n  tags: {type: int64, on_null: omit}\n  name: {type: bytes, on_null: omit}\n"
        f'output: {{path: "{root / "out"}", num_shards: 1}}\nshuffle: {{enabled: false}}\nsplits: {{train: 1.0}}\n')
    assert build_main([str(root / "build.yaml"), "--quiet"]) == 0
    return root


def shard_records(dataset: pathlib.Path) -> list[bytes]:
    (shard,) = glob.glob(str(dataset / "out" / "train" / "*.tfrecord*"))
    return list(read_records(shard))


def test_the_examples_lack_the_features_where_the_input_was_null(dataset):
    decoded = [tfrbeam.decode_example(record) for record in shard_records(dataset)]
    assert [("tags" in example, "name" in example) for example in decoded] == [
        (tags is not None, name is not None) for tags, name in zip(TAGS, NAMES)]


def test_every_arrow_output_has_null_where_a_feature_is_absent_and_the_same_bytes(dataset, tmp_path, capsys):
    batches = list(tfrbeam.open_dataset(str(dataset / "out"), "train", output="arrow", batch_size=3))
    reader = pa.Table.from_batches(batches).combine_chunks()
    decoded = pa.Table.from_batches([tfrbeam.examples_to_record_batch(shard_records(dataset), schema=reader.schema)])
    assert tfrbeam_main(["export", str(dataset / "out"), str(tmp_path / "parquet")]) == 0
    (exported_path,) = glob.glob(str(tmp_path / "parquet" / "train" / "*.parquet"))
    exported = pq.read_table(exported_path)
    assert reader.column("tags").to_pylist() == TAGS
    assert reader.column("name").to_pylist() == [None if name is None else [name] for name in NAMES]
    for name in ("id", "tags", "name"):
        assert decoded.column(name).combine_chunks().equals(reader.column(name).combine_chunks()), name
    # The export writes a scalar column for name (shape [] in the manifest): null where absent, too; text whose
    # every value is UTF-8 is exported as Arrow strings.
    assert exported.schema.field("tags").type == reader.schema.field("tags").type
    for name in ("id", "tags"):
        assert exported.column(name).combine_chunks().equals(reader.column(name).combine_chunks()), name
    assert exported.schema.field("name").type == pa.string()
    assert exported.column("name").to_pylist() == [None if name is None else name.decode() for name in NAMES]
    assert reader.column("tags").null_count == decoded.column("tags").null_count == exported.column("tags").null_count == 3


def test_without_a_schema_the_decoder_agrees_too(dataset):
    inferred = tfrbeam.examples_to_record_batch(shard_records(dataset))
    assert inferred.column("tags").to_pylist() == TAGS
    assert inferred.column("name").to_pylist() == [None if name is None else [name] for name in NAMES]


def test_absence_survives_shuffling_and_threads_and_processes(dataset):
    expected = sorted(zip(range(len(TAGS)), map(repr, TAGS)))
    for executor in ("threads", "processes"):
        batches = tfrbeam.open_dataset(str(dataset / "out"), "train", output="arrow", batch_size=2, shuffle_buffer=5,
                                       seed=7, executor=executor, num_workers=2)
        rows = pa.Table.from_batches(list(batches)).to_pylist()
        assert sorted((row["id"], repr(row["tags"])) for row in rows) == expected, executor


def test_numpy_output_still_reads_an_absent_feature_as_no_values(dataset):
    batch = next(iter(tfrbeam.open_dataset(str(dataset / "out"), "train", batch_size=len(TAGS))))
    assert [row.tolist() for row in batch["tags"].to_list()] == [tags or [] for tags in TAGS]


def test_block_operations_keep_which_rows_lack_a_feature(dataset):
    """take, slice, concat and the shuffle pool carry the absent rows along with the values."""
    features = {"tags": VarLenFeature("int64")}
    decoder = BlockDecoder(features, record_type="Example")
    records = shard_records(dataset)
    ids = np.arange(len(records), dtype=np.int64)
    block = decoder.layout.unpack(decoder.decode(RecordBlock.from_payloads(records, ids), "shard", ids))
    assert to_arrow(block, features).column(0).to_pylist() == TAGS
    order = np.array([7, 0, 1, 2])
    assert to_arrow(take_block(block, order), features).column(0).to_pylist() == [TAGS[i] for i in order]
    assert to_arrow(slice_block(block, 3, 6), features).column(0).to_pylist() == TAGS[3:6]
    both = concat_blocks([slice_block(block, 0, 2), slice_block(block, 2, 8)])
    assert to_arrow(both, features).column(0).to_pylist() == TAGS
    pool = ShufflePool(4, np.random.default_rng(3))
    pool.add(slice_block(block, 0, 5))
    pool.add(slice_block(block, 5, 8))
    drawn = pool.pop(len(TAGS))
    assert sorted(drawn[ID_KEY].leaf.tolist()) == ids.tolist()
    assert to_arrow(drawn, features).column(0).to_pylist() == [TAGS[i] for i in drawn[ID_KEY].leaf.tolist()]
