"""A shard's records in (key, frame bytes) order (tfrbeam/builder/shuffle/order.py), at the cost of distinct keys.

Equal keys come from equal records (duplicates: the key is a bijection of 64 content-digest bits) or,
very rarely or by design, from different records. The order must be (key, frame bytes) either way,
so the output bytes never depend on arrival order, and duplicates must not cost a call per record.
"""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tfrbeam.builder.shuffle import (
    INLINE,
    MEMORY,
    SPILL,
    KeyedRecords,
    make_piece_store,
    order as order_module,
    runs_holding_pieces,
)
from tfrbeam.builder.shuffle.order import KeptOrder, TieCheck, TiedRecordsDiffer, kept_order, shard_order
from tfrbeam.builder.shuffle.received import Received
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, frame_record


def _records(payloads: list[bytes], keys: list[int]) -> KeyedRecords:
    data = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    offsets = np.zeros(len(payloads) + 1, np.int64)
    np.cumsum([len(item) for item in payloads], out=offsets[1:])
    return KeyedRecords(np.zeros(len(payloads), np.uint16), np.array(keys, dtype=np.uint64), offsets, data)


def _received(payloads: list[bytes], keys: list[int], parts: int, store_name: str, tmp_path,
              read_bytes: int = 4096) -> Received:
    """The records as a shard writer receives them: ``parts`` pieces, each sorted and kept in ``store_name``."""
    store = make_piece_store(store_name, str(tmp_path), budget=0 if store_name == SPILL else 1 << 30)
    bounds = np.linspace(0, len(payloads), parts + 1).astype(int)
    pieces = [store.add(_records(payloads[a:b], keys[a:b])) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    store.flush()
    return Received(pieces, store, read_bytes=read_bytes)


def _expected(payloads: list[bytes], keys: list[int]) -> list[bytes]:
    """The reference order: by key, then by the whole frame's bytes."""
    return [frame for _, frame in sorted(zip(keys, map(frame_record, payloads)))]


def _order_counting_reads(received: Received) -> tuple[np.ndarray, list[int]]:
    """``shard_order(received)`` and the number of records in every bulk comparison it made (a per-record read fails)."""
    calls: list[int] = []
    same_as_previous = Received.same_as_previous

    def counted(self, positions):
        calls.append(len(positions))
        return same_as_previous(self, positions)

    def one_record(self, position):
        raise AssertionError(f"a per-record read of record {position}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Received, "same_as_previous", counted)
        patch.setattr(Received, "frame", one_record)
        return shard_order(received), calls


def _ordered_frames(received: Received) -> list[bytes]:
    return [received.frame(int(position)) for position in shard_order(received)]


@pytest.fixture(autouse=True)
def _no_held_pieces_left():
    yield
    for run in runs_holding_pieces():
        from tfrbeam.builder.shuffle import discard_pieces

        discard_pieces(run)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.binary(max_size=12)), min_size=1, max_size=80),
    st.integers(1, 4), st.sampled_from([INLINE, SPILL, MEMORY]), st.randoms(use_true_random=False),
)
def test_order_is_by_key_then_frame_bytes_with_duplicates_and_colliding_keys(tmp_path_factory, items, parts, store, rng):
    """Few keys for many records: runs of equal keys mix duplicates and different records (a collision)."""
    rng.shuffle(items)
    keys, payloads = [key for key, _ in items], [payload for _, payload in items]
    received = _received(payloads, keys, parts, store, tmp_path_factory.mktemp("order"))
    assert _ordered_frames(received) == _expected(payloads, keys)


def test_duplicates_cost_no_call_per_record(tmp_path):
    """Every record ten times: the order is found with a few bulk reads, not one read per tied record."""
    rng = random.Random(5)
    distinct = [rng.randbytes(rng.randint(1, 60)) for _ in range(400)]
    payloads = [payload for payload in distinct for _ in range(10)]
    keys = [int.from_bytes(payload[:8].ljust(8, b"\0"), "little") for payload in payloads]
    order = list(range(len(payloads)))
    rng.shuffle(order)
    payloads, keys = [payloads[i] for i in order], [keys[i] for i in order]
    for store in (INLINE, SPILL, MEMORY):
        received = _received(payloads, keys, 3, store, tmp_path / store, read_bytes=1 << 20)
        positions, calls = _order_counting_reads(received)
        assert len(calls) <= 4, (store, len(calls))  # one bulk read per chunk of tied records
        assert [received.frame(int(p)) for p in positions] == _expected(payloads, keys)


def _calls_ordering(received: Received) -> int:
    """How many Python and C function calls ``shard_order(received)`` makes, all levels counted."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        shard_order(received)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("store", [INLINE, SPILL, MEMORY])
def test_ordering_duplicates_makes_no_call_per_record(tmp_path, store):
    """Four times the duplicates, the same calls: tied records are compared in bulk, not one call (or slice) per pair."""
    rng = random.Random(9)
    counts = []
    for distinct_records in (100, 400):
        distinct = [rng.randbytes(rng.randint(20, 60)) for _ in range(distinct_records)]
        payloads = [payload for payload in distinct for _ in range(10)]
        rng.shuffle(payloads)
        keys = [int.from_bytes(payload[:8], "little") for payload in payloads]
        received = _received(payloads, keys, 3, store, tmp_path / f"{store}-{distinct_records}", read_bytes=1 << 20)
        counts.append(_calls_ordering(received))
    assert counts[1] < counts[0] * 1.25, counts


def test_tied_records_are_read_in_bounded_chunks(tmp_path, monkeypatch):
    """Checking ties reads at most a chunk of records at once, so a shard of duplicates keeps its memory bound."""
    monkeypatch.setattr(order_module, "TIE_CHECK_BYTES", 1000)
    payloads = [bytes([index % 7]) * 40 for index in range(700)]  # 7 records, 100 times each
    keys = [index % 7 for index in range(700)]
    received = _received(payloads, keys, 2, MEMORY, tmp_path)
    positions, calls = _order_counting_reads(received)
    assert calls and max(calls) <= 1000 // (40 + 16) + 1  # a chunk's records and the one before them
    assert [received.frame(int(p)) for p in positions] == _expected(payloads, keys)


def _written(received: Received, start: int, end: int, block_records: int) -> tuple[list[bytes], bool]:
    """The frames a shard writer writes for sorted positions ``start:end``, ``block_records`` a block (as WriteShard):
    kept_order's order, checked block by block, or shard_order's when a check fails; and whether one failed."""
    kept = kept_order(received, start, end)
    ties = TieCheck(kept)
    try:
        for first in range(0, len(kept.positions), block_records):
            positions = kept.positions[first:first + block_records]
            ties.block(received.frames(positions), received.payload_lengths(positions) + RECORD_OVERHEAD, first)
    except TiedRecordsDiffer:
        return [received.frame(int(p)) for p in shard_order(received)[start:end]], True
    return [received.frame(int(p)) for p in kept.positions], False


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=3)), min_size=1, max_size=60),
    st.integers(1, 3), st.sampled_from([INLINE, SPILL, MEMORY]), st.integers(1, 7), st.data(),
)
def test_a_writer_writes_the_order_of_sorting_every_run_by_bytes(tmp_path_factory, items, parts, store, block_records, data):
    """Ties left in arrival order and checked as written (or written again when a check fails) give the
    records of sorting by (key, frame bytes), for any rank range the shard keeps and any block size."""
    keys, payloads = [key for key, _ in items], [payload for _, payload in items]
    received = _received(payloads, keys, parts, store, tmp_path_factory.mktemp("kept"), read_bytes=64)
    start = data.draw(st.integers(0, len(items)))
    end = data.draw(st.integers(start, len(items)))
    written, again = _written(received, start, end, block_records)
    expected = _expected(payloads, keys)
    assert written == expected[start:end]
    # Written again only when a run the shard keeps whole holds different records.
    runs: dict[int, set[bytes]] = {}
    for key, payload in items:
        runs.setdefault(key, set()).add(payload)
    ranks = {key: [i for i, (k, _) in enumerate(sorted(zip(keys, map(frame_record, payloads)))) if k == key] for key in runs}
    whole_and_mixed = [key for key, found in runs.items()
                       if len(found) > 1 and start <= ranks[key][0] and ranks[key][-1] < end]
    assert again == bool(whole_and_mixed)


def test_a_writer_compares_duplicates_only_in_the_frames_it_writes(tmp_path):
    """Every record ten times: nothing is compared before writing but the runs the kept range cuts; the
    checks then find every run identical, so the shard is written once, in arrival order within runs."""
    rng = random.Random(6)
    distinct = [rng.randbytes(rng.randint(20, 60)) for _ in range(300)]
    payloads = [payload for payload in distinct for _ in range(10)]
    rng.shuffle(payloads)
    keys = [int.from_bytes(payload[:8], "little") for payload in payloads]
    compared: list[int] = []
    same_as_previous = Received.same_as_previous

    def counted(self, positions):
        compared.append(len(positions))
        return same_as_previous(self, positions)

    for store in (INLINE, SPILL, MEMORY):
        received = _received(payloads, keys, 3, store, tmp_path / store, read_bytes=1 << 20)
        compared.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Received, "same_as_previous", counted)
            written, again = _written(received, 995, 2005, 256)  # cuts two runs of 10
        assert not again and written == _expected(payloads, keys)[995:2005]
        assert sum(compared) <= 20, (store, compared)


def test_tie_check_finds_different_tied_records_within_and_across_blocks():
    frames = [frame_record(payload) for payload in (b"a", b"a", b"b", b"b", b"c")]
    sizes = np.array([len(frame) for frame in frames], dtype=np.int64)

    def check(unchecked: list[bool], blocks: list[tuple[int, int]]) -> None:
        ties = TieCheck(KeptOrder(np.arange(5), np.array(unchecked)))
        for low, high in blocks:
            ties.block(b"".join(frames[low:high]), sizes[low:high], low)

    check([False, True, False, True, False], [(0, 5)])
    check([False, True, False, True, False], [(0, 1), (1, 4), (4, 5)])  # a pair across a block boundary, equal
    for blocks in ([(0, 5)], [(0, 2), (2, 5)], [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]):
        with pytest.raises(TiedRecordsDiffer, match="kept record 2"):
            check([False, True, True, True, False], blocks)  # b after a: the pair spans blocks in two cases
    TieCheck(KeptOrder(np.arange(5))).block(b"".join(frames), sizes, 0)  # no ties: nothing to check
