"""The tally of copies (tfrbeam/builder/shuffle/copies.py): copy k of a record keyed occurrence_keys(key, k), whatever
the pieces, their order and the piece store; every record kept, copies spread over the shards (issue 42 item 6)."""

from __future__ import annotations

import collections
import pathlib
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.builder.shuffle.test_shuffle import _expected_order, _file_bytes, _pieces, _read_split, _run, _spec
from tfrbeam.builder.shuffle import (
    INLINE,
    MEMORY,
    SPILL,
    Piece,
    PieceCoder,
    PieceRef,
    key_range_bounds,
    make_piece_store,
    occurrence_keys,
    seeded_sort_keys,
    tally_copies,
)


def test_copy_zero_keeps_its_key_and_the_copies_of_one_record_get_distinct_uniform_keys():
    keys = seeded_sort_keys(np.arange(1000, dtype=np.uint64), 3)
    np.testing.assert_array_equal(occurrence_keys(keys, np.zeros(1000, np.uint64)), keys)
    one = np.full(10_000, keys[0], np.uint64)
    copies = occurrence_keys(one, np.arange(10_000, dtype=np.uint64))
    assert len(np.unique(copies)) == 10_000
    # Uniform: the copies' top 4 bits fall evenly in 16 ranges (chi-square, 15 degrees of freedom, p < 1e-6 at 50).
    observed = np.bincount((copies >> np.uint64(60)).astype(np.int64), minlength=16)
    assert ((observed - 625) ** 2 / 625).sum() < 50


def test_key_ranges_cut_records_sorted_by_split_and_key_by_their_top_bits():
    rng = np.random.default_rng(5)
    split = np.sort(rng.integers(0, 3, 5000)).astype(np.uint16)
    key = rng.integers(0, 2**64, 5000, dtype=np.uint64, endpoint=False)
    key = key[np.lexsort((key, split))]
    bounds = key_range_bounds(split, key, 4)
    assert [first for _, first, _ in bounds] == [0] + [end for _, _, end in bounds[:-1]]
    assert bounds[-1][2] == 5000
    for index, first, end in bounds:
        assert set((key[first:end] >> np.uint64(60)).tolist()) == {index} and len(set(split[first:end].tolist())) == 1
    assert key_range_bounds(split, key, 4, only=7) == [bound for bound in bounds if bound[0] == 7]
    assert key_range_bounds(np.zeros(0, np.uint16), np.zeros(0, np.uint64), 4) == []


def test_a_piece_crosses_to_the_tally_with_its_footers_and_to_the_writers_without_them():
    records = _pieces([bytes([n]) * (n % 7 + 1) for n in range(50)], [50], [0.5, 0.5], seed=1)[0]
    store = make_piece_store(INLINE, "unused")
    piece = store.add(records)
    assert piece.footers is not None and piece.ref.location
    coder = PieceCoder()
    part = store.tally_part(piece, 10, 30)
    decoded = coder.decode(coder.encode(part))
    assert decoded.ref.packed is None and decoded.ref.data is None and decoded.ref.location == piece.ref.location
    np.testing.assert_array_equal(decoded.footers, piece.footers[10:30])
    np.testing.assert_array_equal(decoded.key, piece.key[10:30])
    assert coder.estimate_size(part) == len(coder.encode(part))
    for crossing in (store.crossing(piece), store.route_slice(piece, 10, 30)):
        assert crossing.footers is None and coder.decode(coder.encode(crossing)).footers is None
    # The footers are the frames' own: what a writer reads back.
    np.testing.assert_array_equal(store.records(piece).footers, piece.footers)


def test_every_store_gives_the_tally_the_keys_and_footers_of_each_key_range(tmp_path):
    """Spill: a stub of a record range, read back from the keys file. Memory: whole pieces, each range found in the
    held keys, or bisected in the keys file of a spilled run."""
    from tfrbeam.builder.shuffle import discard_pieces

    payloads = [random.Random(number).randbytes(10 + number % 30) for number in range(2000)]
    records = _pieces(payloads, [2000], [0.7, 0.3], seed=3, with_crcs=True)[0]
    (tmp_path / "spill").mkdir()
    reference = make_piece_store(INLINE, "unused").add(records)
    spill = make_piece_store(SPILL, str(tmp_path))
    spilled = spill.add(records)
    spill.flush()
    memory = make_piece_store(MEMORY, str(tmp_path / "memory"), 1 << 20, merge_runs=True)
    held = memory.add(records)
    tiny = make_piece_store(MEMORY, str(tmp_path / "tiny"), 10, merge_runs=True)  # spilled as it comes
    coder = PieceCoder()
    tiny_piece = coder.decode(coder.encode(tiny.add(records)))  # as the tally gets it: its keys left on disk
    assert len(tiny_piece) == 0
    try:
        for index, first, end in key_range_bounds(reference.split, reference.key, 4):
            stub = spill.tally_part(spilled, first, end)
            assert stub.is_stub
            parts = [spill.with_keys(stub)]
            for store, piece in ((memory, held), (tiny, tiny_piece)):
                (run,) = store.runs_of([piece])
                parts += [part for start, part in store.range_parts(run, index, 4) if start == first]
            assert len(parts) == 3
            for part in parts:
                for name in ("split", "key", "footers"):
                    np.testing.assert_array_equal(getattr(part, name), getattr(reference, name)[first:end])
    finally:
        spill.close(), memory.close(), tiny.close()
        discard_pieces(str(tmp_path / "memory")), discard_pieces(str(tmp_path / "tiny"))


def _part(keys: list[int], footers: list[int], split: int = 0, length: int = 20) -> Piece:
    offsets = np.arange(len(keys) + 1, dtype=np.int64) * length
    return Piece(np.full(len(keys), split, np.uint16), np.array(keys, np.uint64), offsets, PieceRef(INLINE),
                 np.array(footers, "<u4"))


def test_the_tally_numbers_copies_across_pieces_and_leaves_records_that_only_share_a_key():
    # Key 5: record A (footer 1) three times over two pieces, record B (footer 2) once: B keeps key 5 as A's copy 0
    # does (the writers order them by bytes). Key 9: once only.
    parts = [("b", 0, _part([5, 5, 9], [1, 2, 7])), ("a", 10, _part([5, 5], [1, 1]))]
    counts, moved = tally_copies(parts, bucket_bits=10)
    by_name = {copies.location: copies for copies in moved}
    assert sorted(by_name) == ["a", "b"]
    # Numbered in (name, place) order: a's two copies are copies 0 and 1, b's first record copy 2.
    assert by_name["a"].positions.tolist() == [11] and by_name["b"].positions.tolist() == [0]
    expected = occurrence_keys(np.array([5, 5], np.uint64), np.array([1, 2], np.uint64))
    assert by_name["a"].occurrences.tolist() == [1] and by_name["b"].occurrences.tolist() == [2]
    assert by_name["a"].positions.dtype == by_name["a"].occurrences.dtype == np.uint32
    _, buckets, count, size, largest = counts.histogram
    assert count.sum() == 5 and size.sum() == 100 and set(largest.tolist()) == {20}
    assert set(buckets.tolist()) == {0} | {int(key) >> 54 for key in expected}
    # Equal split and key, but another length or split: other records, not copies.
    assert tally_copies([("a", 0, _part([5], [1], length=20)), ("b", 0, _part([5], [1], length=21))], 10)[1] == []
    assert tally_copies([("a", 0, _part([5], [1], split=0)), ("b", 0, _part([5], [1], split=1))], 10)[1] == []


def test_the_tally_gives_the_same_keys_whatever_the_order_of_its_parts():
    rng = random.Random(4)
    parts = [(f"piece-{number}", 0, _part(sorted(rng.choices(range(40), k=30)), [0] * 30)) for number in range(6)]
    first = tally_copies(parts, 10)
    again = tally_copies(list(reversed(parts)), 10)
    assert [(m.location, m.positions.tolist(), m.occurrences.tolist()) for m in first[1]] == [
        (m.location, m.positions.tolist(), m.occurrences.tolist()) for m in again[1]]
    for left, right in zip(first[0].histogram, again[0].histogram):
        np.testing.assert_array_equal(left, right)
    distinct = {int(key) for _, _, part in parts for key in part.key}
    assert sum(len(m) for m in first[1]) == 180 - len(distinct)  # every record after its first copy moves


STORES = [(INLINE, 1 << 30), (SPILL, 0), (MEMORY, 1 << 30), (MEMORY, 600)]  # the last spills all but a few pieces


@settings(max_examples=12, deadline=None)
@given(
    counts=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    cuts=st.lists(st.integers(1, 200), min_size=1, max_size=6),
    store=st.sampled_from(STORES),
    seed=st.integers(0, 3),
    reverse=st.booleans(),
)
def test_any_multiset_of_records_comes_out_as_the_same_permutation_whatever_the_pieces_and_store(
        tmp_path_factory, counts, cuts, store, seed, reverse):
    """Random records with random numbers of copies, cut into random pieces in either order: each split is the
    records in (copy's key, bytes) order, the same bytes as one piece of them all in the inline store, every
    copy kept."""
    rng = random.Random(len(counts) * 1000 + seed)
    distinct = [rng.randbytes(rng.randint(1, 30)) + bytes([number]) for number in range(len(counts))]
    payloads = [record for record, count in zip(distinct, counts) for _ in range(count)]
    rng.shuffle(payloads)
    spec = _spec(num_shards=(3, 2))
    directory = tmp_path_factory.mktemp("copies")
    pieces = _pieces(payloads, [*cuts, len(payloads)], [0.6, 0.4], seed=seed, with_crcs=True)
    name, budget = store
    _run(list(reversed(pieces)) if reverse else pieces, spec, directory / "cut", name, budget)
    _run(_pieces(payloads, [len(payloads)], [0.6, 0.4], seed=seed), spec, directory / "whole")
    assert _file_bytes(directory / "cut") == _file_bytes(directory / "whole")
    expected = _expected_order(payloads, [0.6, 0.4], seed)
    for index, split in enumerate(spec.splits):
        written = [record for shard in _read_split(directory / "cut", split) for record in shard]
        assert written == expected.get(index, [])
    assert sum(len(records) for records in expected.values()) == len(payloads)


@pytest.mark.parametrize("store", STORES)
def test_many_copies_of_one_record_reach_every_shard(tmp_path: pathlib.Path, store):
    """300 copies of one record among 700 others, 8 shards: a uniform permutation leaves none of them without a
    copy but with probability 8 * (7/8)**300, about 3e-17; before, all 300 sat together in one shard."""
    rng = random.Random(9)
    payloads = [b"the same row"] * 300 + [rng.randbytes(12) for _ in range(700)]
    rng.shuffle(payloads)
    spec = _spec(splits=("train",), num_shards=(8,))
    name, budget = store
    _run(_pieces(payloads, [170, 330, 500], [1.0], seed=2, with_crcs=True), spec, tmp_path, name, budget)
    shards = _read_split(tmp_path, "train")
    assert [shard.count(b"the same row") > 0 for shard in shards] == [True] * 8
    assert collections.Counter(record for shard in shards for record in shard) == collections.Counter(payloads)
    records = [record for shard in shards for record in shard]
    together = sum(first == second == b"the same row" for first, second in zip(records, records[1:]))
    assert together < 150  # a uniform order puts about 300 * 299 / 1000 = 90 of them after another; before, 299


def test_a_spilled_piece_damaged_on_disk_before_it_is_put_in_order_again_fails_when_its_shard_is_read(tmp_path):
    """The rekeyed file carries each payload with the CRC of the old one: the writers' check finds the damage."""
    from tfrbeam.builder.shuffle import MovedCopies
    from tfrbeam.errors import ShuffledDataError

    (tmp_path / "spill").mkdir()
    store = make_piece_store(SPILL, str(tmp_path))
    payloads = [bytes([number % 50]) * 40 for number in range(200)]  # 50 records, 4 copies each
    piece = store.add(_pieces(payloads, [200], [1.0], seed=1, with_crcs=True)[0])
    store.flush()
    with open(piece.ref.location, "r+b") as handle:  # one payload byte of record 120
        handle.seek(int(piece.offsets[120]) + 12 + 5)
        handle.write(b"\xff")
    moved = {piece.ref.location: [MovedCopies.of(piece.ref.location, np.arange(1, 200, 4), np.ones(50, np.uint64))]}
    rekeyed = store.rekeyed(store.crossing(piece), moved)
    assert rekeyed.ref.location != piece.ref.location and len(rekeyed) == 200
    with pytest.raises(ShuffledDataError, match="fails its data CRC"):
        store.records(rekeyed)
    store.close()
