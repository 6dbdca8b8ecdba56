"""An inline piece's frames compressed in blocks (tfrbeam/builder/shuffle/packed.py): what crosses the runner's shuffle."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from hypothesis import given, strategies as st

from tfrbeam.builder.shuffle import INLINE, KeyedRecords, Piece, PieceCoder, PieceRef, make_piece_store
from tfrbeam.builder.shuffle.packed import BLOCK_BYTES, PackedFrames, pack_frames
from tfrbeam.errors import ShuffledDataError
from tfrbeam.tfrecord.records import frame_records


def _compressible(size: int, seed: int = 0) -> np.ndarray:
    """Bytes like a table's Examples: field names and small numbers repeat."""
    rng = np.random.default_rng(seed)
    words = [b"feature", b"label", b"\x08\x01\x12", b"carrier", b"origin", b"\x00\x00"]
    chunks = [words[i] for i in rng.integers(0, len(words), size // 4 + 1)]
    return np.frombuffer(b"".join(chunks)[:size], dtype=np.uint8)


@given(
    size=st.integers(0, 5000),
    block=st.integers(1, 700),
    cuts=st.lists(st.integers(0, 5000), min_size=2, max_size=6),
    incompressible=st.booleans(),
)
def test_any_byte_range_of_packed_frames_unpacks_to_the_same_bytes(size, block, cuts, incompressible):
    frames = (np.frombuffer(os.urandom(size), np.uint8) if incompressible else _compressible(size))
    packed = pack_frames(frames, block_bytes=block)
    assert packed.unpacked().tobytes() == frames.tobytes()
    # Narrowed twice, as the routing stage narrows a piece and then a slice of it.
    low, high = sorted(min(cut, size) for cut in cuts[:2])
    narrow = packed.narrowed(low, high)
    assert narrow.unpacked().tobytes() == frames[low:high].tobytes()
    inner_low, inner_high = sorted(min(cut, high - low) for cut in (cuts + [0, 0])[2:4])
    assert narrow.narrowed(inner_low, inner_high).unpacked().tobytes() == frames[low:high][inner_low:inner_high].tobytes()
    # A range keeps only the blocks it overlaps.
    if high > low:
        assert len(narrow.raw_sizes) == (high - 1) // block - low // block + 1


def test_compressible_frames_shrink_and_incompressible_blocks_are_kept_as_they_are():
    frames = _compressible(4 * BLOCK_BYTES)
    packed = pack_frames(frames)
    assert packed.nbytes < frames.nbytes / 2
    assert (packed.stored_sizes < packed.raw_sizes).all()
    noise = np.frombuffer(os.urandom(3 * BLOCK_BYTES + 11), np.uint8)
    kept = pack_frames(noise)
    assert kept.nbytes == noise.nbytes and (kept.stored_sizes == kept.raw_sizes).all()
    assert kept.unpacked().tobytes() == noise.tobytes()
    mixed = pack_frames(np.concatenate([frames[:BLOCK_BYTES], noise[:BLOCK_BYTES]]))
    assert mixed.stored_sizes[0] < BLOCK_BYTES == mixed.stored_sizes[1]


def _inline_piece(payloads: list[bytes]) -> Piece:
    offsets = np.zeros(len(payloads) + 1, np.int64)
    np.cumsum([len(payload) for payload in payloads], out=offsets[1:])
    data = np.frombuffer(b"".join(payloads), np.uint8)
    records = KeyedRecords(np.zeros(len(payloads), np.uint16), np.arange(len(payloads), dtype=np.uint64)[::-1].copy(),
                           offsets, data)
    return make_piece_store(INLINE, "/nonexistent").add(records)


def test_an_inline_piece_crosses_the_runner_compressed_and_its_slices_without_decompressing():
    payloads = [b"carrier=AA origin=JFK dest=LAX delay=%d" % (index % 50) for index in range(40_000)]
    piece = _inline_piece(payloads)
    coder = PieceCoder()
    frames = frame_records(payloads[::-1])  # keys descend with the input: sorted, the records run backwards
    assert piece.ref.packed is not None and piece.ref.data is None
    encoded = coder.encode(piece)
    assert coder.estimate_size(piece) == len(encoded)
    assert len(encoded) < len(frames) / 3  # the frames compress; keys and offsets add 12 bytes a record
    decoded = coder.decode(encoded)
    assert decoded.ref.frames().tobytes() == frames
    # The routing stage cuts the decoded piece into slices, and each slice's element holds only the blocks it
    # overlaps: as many bytes in all as the piece, plus at most one block per cut.
    cuts = [0, 9_999, 10_000, 25_001, 40_000]
    slices = [decoded.slice(low, high) for low, high in zip(cuts, cuts[1:])]
    sent = [coder.encode(part) for part in slices]
    piece_blocks = decoded.ref.packed.nbytes
    assert piece_blocks <= sum(coder.decode(item).ref.packed.nbytes for item in sent) <= piece_blocks + 4 * BLOCK_BYTES
    store = make_piece_store(INLINE, "/nonexistent")
    for (low, high), part, item in zip(zip(cuts, cuts[1:]), slices, sent):
        received = coder.decode(item)
        assert coder.estimate_size(part) == len(item)
        assert received.ref.frames().tobytes() == frames[int(decoded.offsets[low]):int(decoded.offsets[high])]
        stored = store.records(received)
        assert [bytes(stored.buffer[start:start + length])
                for start, length in zip(stored.starts.tolist(), stored.lengths.tolist())] == payloads[::-1][low:high]


def test_an_empty_piece_and_raw_frames_still_cross_as_they_are():
    coder = PieceCoder()
    empty = Piece.empty()
    assert coder.decode(coder.encode(empty)).ref.frames().tobytes() == b""
    frames = np.frombuffer(frame_records([b"a", b"bc"]), np.uint8)
    raw = Piece(np.zeros(2, np.uint16), np.arange(2, dtype=np.uint64), np.array([0, 17, 35]), PieceRef(INLINE, frames))
    assert coder.decode(coder.encode(raw)).ref.frames().tobytes() == frames.tobytes()
    assert isinstance(pack_frames(frames), PackedFrames)


def _damaged(packed: PackedFrames, block: int, at: int = 10) -> PackedFrames:
    """``packed`` with one byte of its stored block ``block`` flipped, as a runner that damaged the element would."""
    stored = packed.stored.copy()
    start = int(packed.stored_sizes[:block].sum())
    stored[start + min(at, int(packed.stored_sizes[block]) - 1)] ^= 0x40
    return dataclasses.replace(packed, stored=stored)


def test_a_damaged_compressed_block_is_refused_naming_the_block():
    packed = pack_frames(_compressible(4 * BLOCK_BYTES))
    assert (packed.stored_sizes < packed.raw_sizes).all()
    for at in (5, int(packed.stored_sizes[2]) // 2, int(packed.stored_sizes[2]) - 1):
        with pytest.raises(ShuffledDataError, match=r"block 2 of 4") as caught:
            _damaged(packed, 2, at).unpacked()
        assert "the runner delivered" in str(caught.value)


def test_a_damaged_block_kept_raw_is_refused_too():
    packed = pack_frames(np.frombuffer(os.urandom(3 * BLOCK_BYTES), np.uint8))
    assert (packed.stored_sizes == packed.raw_sizes).all()
    with pytest.raises(ShuffledDataError, match=r"block 1 of 3 .*checksum"):
        _damaged(packed, 1).unpacked()
    # A narrowed slice keeps its blocks' checksums, so it is checked as well.
    with pytest.raises(ShuffledDataError, match=r"block 0 of 1"):
        _damaged(packed.narrowed(BLOCK_BYTES + 5, BLOCK_BYTES + 90), 0).unpacked()


def test_a_piece_damaged_on_its_way_through_the_runner_is_refused_after_decoding():
    payloads = [b"carrier=AA origin=JFK dest=LAX delay=%d" % (index % 50) for index in range(20_000)]
    coder = PieceCoder()
    encoded = bytearray(coder.encode(_inline_piece(payloads)))
    encoded[-100] ^= 0x01  # inside the last block's stored bytes
    damaged = coder.decode(bytes(encoded))
    with pytest.raises(ShuffledDataError, match=r"block \d+ of \d+"):
        make_piece_store(INLINE, "/nonexistent").records(damaged)
