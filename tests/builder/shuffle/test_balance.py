"""Shards are balanced to within one record, whatever the remainder of records over shards.

Sizes are chosen so that ``records % shards`` is well above 1: a layout that gives the whole
remainder to one shard (the last) then shows as a shard ``remainder - 1`` records too big.
"""

from __future__ import annotations

import collections
import pathlib

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import given, strategies as st

from tfrbeam.builder.shuffle import (
    KeyedRecords,
    ShardingSpec,
    SplitPlan,
    WriteShuffledShards,
    input_order_keys,
    record_checksums,
    seeded_sort_keys,
    split_indices,
)
from tfrbeam.tfrecord.records import read_records


def _split_plan(num_examples: int, num_shards: int) -> SplitPlan:
    empty = np.zeros(0, dtype=np.int64)
    return SplitPlan("train", num_examples, 0, num_shards, empty, empty, empty)


@given(num_examples=st.integers(0, 5000), num_shards=st.integers(1, 64))
def test_shard_ranges_differ_by_at_most_one_and_shard_of_inverts_them(num_examples, num_shards):
    plan = _split_plan(num_examples, num_shards)
    starts = [plan.shard_start(shard) for shard in range(num_shards + 1)]
    assert starts[0] == 0 and starts[-1] == num_examples
    sizes = np.diff(starts)
    assert set(sizes.tolist()) <= {num_examples // num_shards, -(-num_examples // num_shards)}
    assert int(sizes.sum()) == num_examples
    ranks = np.arange(num_examples, dtype=np.int64)
    np.testing.assert_array_equal(plan.shard_of(ranks), np.repeat(np.arange(num_shards), sizes))


@pytest.mark.parametrize("num_examples, num_shards", [(1000, 7), (103, 10), (59, 6)])
def test_a_remainder_above_one_is_spread_one_record_per_shard(num_examples, num_shards):
    assert num_examples % num_shards > 1
    plan = _split_plan(num_examples, num_shards)
    sizes = [plan.shard_start(shard + 1) - plan.shard_start(shard) for shard in range(num_shards)]
    base, remainder = divmod(num_examples, num_shards)
    assert sorted(sizes) == [base] * (num_shards - remainder) + [base + 1] * remainder


def _pieces(payloads: list[bytes], piece_rows: int, seed: int | None) -> list[KeyedRecords]:
    pieces = []
    for start in range(0, len(payloads), piece_rows):
        chunk = payloads[start:start + piece_rows]
        data = np.frombuffer(b"".join(chunk), dtype=np.uint8)
        offsets = np.zeros(len(chunk) + 1, np.int64)
        np.cumsum([len(item) for item in chunk], out=offsets[1:])
        digests, _ = record_checksums(data, offsets)
        if seed is None:
            keys = input_order_keys(0, np.arange(start, start + len(chunk)))
        else:
            keys = seeded_sort_keys(digests[:, 1], seed)
        pieces.append(KeyedRecords(split_indices(digests[:, 0], [1.0]), keys, offsets, data))
    return pieces


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("num_examples, num_shards", [(1000, 7), (503, 9)])
def test_written_shards_are_balanced_with_a_remainder_above_one(tmp_path: pathlib.Path, ordered, num_examples, num_shards):
    payloads = [f"record-{index}".encode() for index in range(num_examples)]
    spec = ShardingSpec(splits=("train",), num_shards=(num_shards,), max_bytes_per_shard=None, ordered=ordered)
    with beam.Pipeline(options=PipelineOptions([])) as pipeline:
        _ = (
            pipeline
            | beam.Create(_pieces(payloads, 130, None if ordered else 5)).with_output_types(KeyedRecords)
            | WriteShuffledShards(spec, str(tmp_path))
        )
    shards = [list(read_records(str(path))) for path in sorted((tmp_path / "train").glob("train-*.tfrecord"))]
    assert len(shards) == num_shards
    base, remainder = divmod(num_examples, num_shards)
    assert sorted(len(shard) for shard in shards) == [base] * (num_shards - remainder) + [base + 1] * remainder
    assert collections.Counter(record for shard in shards for record in shard) == collections.Counter(payloads)
    if ordered:
        assert [record for shard in shards for record in shard] == payloads


def test_a_routing_group_sends_empty_slices_only_to_the_shards_it_sends_nothing():
    """Every shard hears from every group (so every shard is written), with an empty slice only where no records go."""
    from tfrbeam.builder.shuffle.balance import PlanShards
    from tfrbeam.builder.shuffle.route import RouteGroupedPieces, shard_key_of
    from tfrbeam.builder.shuffle.stores import InlineStore

    payloads = [f"record-{index}".encode() for index in range(200)]
    spec = ShardingSpec(splits=("train",), num_shards=(40,), max_bytes_per_shard=None, ordered=False)
    store = InlineStore()
    pieces = [store.add(records) for records in _pieces(payloads, 50, 5)]
    combine = PlanShards(spec)
    accumulator = combine.create_accumulator()
    for piece in pieces:
        accumulator = combine.add_input(accumulator, piece)
    plan = combine.extract_output(accumulator)
    routed = list(RouteGroupedPieces(store).process((0, pieces[:1]), plan))  # 50 records over 40 shards
    every_key = {shard_key_of(0, shard) for shard in range(40)}
    assert {key for key, _ in routed} == every_key
    with_records = [key for key, part in routed if len(part)]
    empties = [key for key, part in routed if not len(part)]
    assert with_records and empties and not set(with_records) & set(empties)
    assert len(empties) == len(every_key - set(with_records)) and len(set(empties)) == len(empties)
    assert sum(len(part) for _, part in routed) == 50


def test_the_plan_counts_what_every_piece_takes_crossing_the_runner():
    """The manifest's shuffled_bytes counts the pieces' crossing into the routing stage from the plan's combine."""
    from tfrbeam.builder.shuffle import PieceCoder
    from tfrbeam.builder.shuffle.balance import PlanShards
    from tfrbeam.builder.shuffle.stores import InlineStore

    payloads = [f"record-{index}".encode() * (index % 7 + 1) for index in range(300)]
    spec = ShardingSpec(splits=("train",), num_shards=(4,), max_bytes_per_shard=None, ordered=False)
    pieces = [InlineStore().add(records) for records in _pieces(payloads, 40, 5)]
    combine = PlanShards(spec)
    halves = []
    for part in (pieces[:3], pieces[3:]):  # two workers' accumulators, merged as a runner would
        accumulator = combine.create_accumulator()
        for piece in part:
            accumulator = combine.add_input(accumulator, piece)
        halves.append(accumulator)
    plan = combine.extract_output(combine.merge_accumulators(halves))
    assert plan.piece_bytes == sum(len(PieceCoder().encode(piece)) for piece in pieces) > 0
    assert sum(split.num_examples for split in plan.splits) == 300
