"""A shard's records in (key, frame bytes) order (tfrbeam/build/shuffle/order.py), at the cost of distinct keys.

Equal keys come from equal records (duplicates: the key is a bijection of 64 content-digest bits) or,
very rarely or by design, from different records. The order must be (key, frame bytes) either way,
so the output bytes never depend on arrival order, and duplicates must not cost a call per record.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tfrbeam.build.shuffle import (
    INLINE,
    MEMORY,
    SPILL,
    KeyedRecords,
    make_piece_store,
    order as order_module,
    runs_holding_pieces,
)
from tfrbeam.build.shuffle.order import shard_order
from tfrbeam.build.shuffle.received import Received
from tfrbeam.tfrecord.records import frame_record


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
    same_records = Received.same_records

    def counted(self, left, right):
        calls.append(len(left))
        return same_records(self, left, right)

    def one_record(self, position):
        raise AssertionError(f"a per-record read of record {position}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Received, "same_records", counted)
        patch.setattr(Received, "frame", one_record)
        return shard_order(received), calls


def _ordered_frames(received: Received) -> list[bytes]:
    return [received.frame(int(position)) for position in shard_order(received)]


@pytest.fixture(autouse=True)
def _no_held_pieces_left():
    yield
    for run in runs_holding_pieces():
        from tfrbeam.build.shuffle import discard_pieces

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


def test_tied_records_are_read_in_bounded_chunks(tmp_path, monkeypatch):
    """Checking ties reads at most a chunk of records at once, so a shard of duplicates keeps its memory bound."""
    monkeypatch.setattr(order_module, "TIE_CHECK_BYTES", 1000)
    payloads = [bytes([index % 7]) * 40 for index in range(700)]  # 7 records, 100 times each
    keys = [index % 7 for index in range(700)]
    received = _received(payloads, keys, 2, MEMORY, tmp_path)
    positions, calls = _order_counting_reads(received)
    assert calls and max(calls) <= 1000 // (40 + 16)
    assert [received.frame(int(p)) for p in positions] == _expected(payloads, keys)
