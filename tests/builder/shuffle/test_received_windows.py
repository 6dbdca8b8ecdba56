"""A shard writer's spilled parts, read a window at a time: the frames of every block equal the records' own frames."""

from __future__ import annotations

import tempfile

import numpy as np
from hypothesis import given, settings, strategies as st

from tfrbeam.builder.shuffle import KeyedRecords, SpillStore, record_checksums
from tfrbeam.builder.shuffle.received import Received
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, frame_records


class _CountingSpillStore(SpillStore):
    """A spill store that counts the windows read back."""

    reads = 0

    def records(self, piece):
        type(self).reads += 1
        return super().records(piece)


def _spilled_parts(store: SpillStore, pieces: list[list[bytes]], rng) -> tuple[list, list[tuple[int, bytes]]]:
    """Each list of payloads as one spilled piece with random keys; the parts and every (key, payload)."""
    parts, everything = [], []
    for payloads in pieces:
        data = np.frombuffer(b"".join(payloads), dtype=np.uint8)
        offsets = np.cumsum([0] + [len(payload) for payload in payloads]).astype(np.int64)
        _, crcs = record_checksums(data, offsets)
        keys = np.array([rng.getrandbits(64) for _ in payloads], dtype=np.uint64)
        parts.append(store.add(KeyedRecords(np.zeros(len(payloads), np.uint16), keys, offsets, data, crcs)))
        everything += list(zip(keys.tolist(), payloads))
    store.flush()
    return parts, everything


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=30), min_size=1, max_size=6),
       st.integers(min_value=1, max_value=400), st.randoms(use_true_random=False))
def test_blocks_read_through_windows_frame_every_record_in_key_order(pieces, read_bytes, rng):
    """Parts of 0-40-byte records, windows of a few bytes to a few hundred: block by block in key order, as the
    writer asks (each block at most a window's share), the frames are the records' own; a block asked again
    reads nothing."""
    with tempfile.TemporaryDirectory() as directory:
        store = _CountingSpillStore(directory)
        parts, everything = _spilled_parts(store, pieces, rng)
        received = Received(parts, store, read_bytes=read_bytes)
        order = np.argsort(received.keys, kind="stable")
        expected = [payload for _, payload in sorted(everything, key=lambda item: item[0])]
        lengths = received.payload_lengths(order) + RECORD_OVERHEAD
        start = 0
        while start < len(order):
            end, size = start + 1, int(lengths[start])
            while end < len(order) and size + int(lengths[end]) <= (received.read_bound or 1 << 62):
                size += int(lengths[end])
                end += 1
            framed = received.frames(order[start:end])
            assert bytes(framed) == frame_records(expected[start:end])
            reads = _CountingSpillStore.reads
            assert bytes(received.frames(order[start:end])) == bytes(framed)
            assert _CountingSpillStore.reads == reads
            start = end
        store.close()
