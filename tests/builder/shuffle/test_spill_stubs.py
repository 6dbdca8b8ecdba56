"""A spill store's pieces cross the runner without their keys (issue 45: the out-of-process paths' memory).

Measured: a ``--workers 2`` build's runner process (the FnApiRunner, which holds every GroupByKey's
elements until the build ends) peaked at 502 MB for 3M rows and 1,005 MB for 12M: about 55 bytes a
row, the 12 bytes of keys and frame offsets each spilled piece and each of its shard slices carried
through the two GroupByKeys, held as encoded and grouped copies. Now a spill store writes a piece's
keys beside its frames and the elements name a record range of that file; the writers read their
slices' keys back.
"""

from __future__ import annotations

import json
import pathlib
import random

import numpy as np
import pyarrow as pa

import tfrbeam
from tests.builder.shuffle.test_shuffle import _pieces, _read_split, _run, _spec
from tfrbeam.builder.shuffle import INLINE, SPILL, PieceCoder, SpillStore
from tfrbeam.builder.shuffle.route import shard_ranges


def _spilled(tmp_path: pathlib.Path, count: int = 5000):
    payloads = [random.Random(number).randbytes(20 + number % 50) for number in range(count)]
    store = SpillStore(str(tmp_path / "spill"))
    (tmp_path / "spill").mkdir()
    store.open()
    piece = store.add(_pieces(payloads, [count], [0.7, 0.3], seed=3)[0])
    store.flush()
    return store, piece


def test_a_spilled_piece_and_its_shard_slices_cross_the_runner_as_a_few_bytes(tmp_path):
    store, piece = _spilled(tmp_path)
    coder = PieceCoder()
    whole = len(coder.encode(piece))
    crossing = coder.decode(coder.encode(store.crossing(piece)))
    assert len(coder.encode(store.crossing(piece))) < 200 < 12 * len(piece) <= whole
    again = store.with_keys(crossing)
    for name in ("split", "key", "offsets"):
        np.testing.assert_array_equal(getattr(again, name), getattr(piece, name))
    assert coder.estimate_size(store.crossing(piece)) == len(coder.encode(store.crossing(piece)))


def test_a_slice_read_back_from_its_stub_is_the_slice_with_the_same_records(tmp_path):
    store, piece = _spilled(tmp_path)
    coder = PieceCoder()
    for low, high in ((0, 1), (17, 2500), (4999, 5000), (0, 5000)):
        stub = coder.decode(coder.encode(store.route_slice(piece, low, high)))
        assert stub.is_stub and len(coder.encode(stub)) < 200
        resolved, expected = store.with_keys(stub), piece.slice(low, high)
        for name in ("split", "key", "offsets"):
            np.testing.assert_array_equal(getattr(resolved, name), getattr(expected, name))
        got, want = store.records(resolved), store.records(expected)
        assert [bytes(got.buffer[s:s + n]) for s, n in zip(got.starts, got.lengths)] == [
            bytes(want.buffer[s:s + n]) for s, n in zip(want.starts, want.lengths)]


def test_the_spill_stores_shards_are_the_inline_stores_bytes(tmp_path):
    payloads = [random.Random(number).randbytes(number % 60) for number in range(12_000)]
    for store in (INLINE, SPILL):
        _run(_pieces(payloads, [1500, 2500, 3000, 5000], [0.8, 0.2], seed=7), _spec(num_shards=(3, 2)),
             tmp_path / store, store)
    for split in ("train", "eval"):
        assert _read_split(tmp_path / SPILL, split) == _read_split(tmp_path / INLINE, split)


def test_a_spill_build_says_its_pieces_crossed_the_runner_without_their_keys(tmp_path):
    """The manifest's shuffled_bytes: what crossed the runner's GroupByKeys. Before: 12 bytes a record, twice."""
    rows = 40_000
    table = pa.table({"id": np.arange(rows), "text": [f"row {number}" for number in range(rows)]})
    result = tfrbeam.write_dataset(table, tmp_path / "spill", num_shards=4, seed=1, progress=False,
                                   pipeline_options=["--piece_store=spill"])
    assert result is not None and sum(result.num_examples.values()) == rows
    manifest = json.loads((tmp_path / "spill" / "tfrbeam_dataset.json").read_text())
    assert manifest["run"]["shuffled_bytes"] < rows, manifest["run"]["shuffled_bytes"]
    tfrbeam.write_dataset(table, tmp_path / "memory", num_shards=4, seed=1, progress=False)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            assert (tmp_path / "spill" / shard["path"]).read_bytes() == (tmp_path / "memory" / shard["path"]).read_bytes()


def test_a_stub_is_routed_by_the_keys_read_back(tmp_path):
    """The routing stage reads a stub's keys from its file: the same shard ranges as the piece in memory."""
    from tfrbeam.builder.shuffle import BucketCounts, make_plan

    store, piece = _spilled(tmp_path)
    spec = _spec(num_shards=(3, 2))
    counts = BucketCounts(spec)
    plan = make_plan(counts.extract_output(counts.add_input(counts.create_accumulator(), piece)), spec)
    assert shard_ranges(store.with_keys(store.crossing(piece)), plan) == shard_ranges(piece, plan)
