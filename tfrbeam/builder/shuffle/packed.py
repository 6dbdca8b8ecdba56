"""An inline piece's frames as they cross the runner: compressed in blocks (zstd level 1, pyarrow's codec).

The inline store is the one whose frames go through the runner's shuffle (Dataflow's, billed by the
byte), twice: into the routing stage and to the shard writers. Blocks let the routing stage cut a
piece into shard slices without decompressing: a slice keeps the blocks its bytes overlap (a block
that straddles a shard boundary goes to both shards) and where its bytes start in the first one.
Only the shard writer decompresses. The shard bytes do not change.

Each block carries the CRC32C of its raw bytes, checked when it is unpacked: a block the runner (or
its storage) damaged on the way is refused by name, never written into a shard (zstd's frames as
pyarrow writes them carry no checksum, and a block kept raw has none at all).
"""

from __future__ import annotations

import dataclasses
import functools

import crc32c
import numpy as np
import pyarrow as pa

from tfrbeam.errors import ShuffledDataError

__all__ = ["BLOCK_BYTES", "CODEC", "PackedFrames", "pack_frames"]

CODEC = "zstd"
LEVEL = 1
# Bytes of frames per block: small, because a block that straddles a piece's shard boundary crosses to both
# shards and a writer's window boundary is decompressed twice; large enough that zstd keeps its ratio (2.44
# on the benchmark table's frames, 2.51 in blocks of 1 MiB).
BLOCK_BYTES = 64 << 10
# A block that does not shrink below this share of its size is kept as it is (JPEG or audio bytes, say):
# decompressing it would cost the writer time for nothing.
KEEP_RAW_ABOVE = 0.97


@functools.cache
def _codec() -> pa.Codec | None:
    """zstd at level 1, or None where this pyarrow was built without it (every block is then kept raw)."""
    if not pa.Codec.is_available(CODEC):
        return None
    return pa.Codec(CODEC, compression_level=LEVEL)


@dataclasses.dataclass(frozen=True, eq=False)
class PackedFrames:
    """Frame bytes ``[skip, skip + size)`` of the blocks in ``stored``: each block compressed, or kept raw when its
    stored size equals its raw size.

    ``stored_sizes`` and ``raw_sizes`` (uint32) give each block's size as stored and unpacked,
    ``raw_crcs`` (uint32) the CRC32C of its unpacked bytes.
    """

    stored: np.ndarray
    stored_sizes: np.ndarray
    raw_sizes: np.ndarray
    raw_crcs: np.ndarray
    skip: int
    size: int

    @property
    def nbytes(self) -> int:
        """The bytes that cross the runner (the blocks as stored)."""
        return int(self.stored.nbytes)

    def narrowed(self, first_byte: int, end_byte: int) -> PackedFrames:
        """Frame bytes ``[first_byte, end_byte)`` of these: the blocks they overlap, no decompression."""
        if end_byte <= first_byte:
            return _EMPTY
        raw_starts = _starts(self.raw_sizes)
        low, high = self.skip + first_byte, self.skip + end_byte
        first_block = int(np.searchsorted(raw_starts, low, side="right")) - 1
        end_block = int(np.searchsorted(raw_starts, high, side="left"))
        stored_starts = _starts(self.stored_sizes)
        return PackedFrames(
            self.stored[int(stored_starts[first_block]):int(stored_starts[end_block])],
            self.stored_sizes[first_block:end_block], self.raw_sizes[first_block:end_block],
            self.raw_crcs[first_block:end_block], low - int(raw_starts[first_block]), high - low,
        )

    def unpacked(self) -> np.ndarray:
        """The frame bytes, decompressed into one new buffer, every block checked against its CRC32C."""
        out = np.empty(int(self.raw_sizes.sum(dtype=np.int64)), dtype=np.uint8)
        stored_at = written = 0
        blocks = zip(self.stored_sizes.tolist(), self.raw_sizes.tolist(), self.raw_crcs.tolist())
        for index, (stored_size, raw_size, expected) in enumerate(blocks):
            block, target = self.stored[stored_at:stored_at + stored_size], out[written:written + raw_size]
            if stored_size == raw_size:
                target[:] = block
            else:
                target[:] = self._decompressed(index, block, raw_size)
            found = crc32c.crc32c(memoryview(target))  # type: ignore[arg-type]  # an ndarray is a buffer
            if found != expected:
                raise ShuffledDataError(self._damage(index, f"its bytes fail their checksum (CRC32C {found:#010x}, "
                                                            f"packed with {expected:#010x})"))
            stored_at += stored_size
            written += raw_size
        return out[self.skip:self.skip + self.size]

    def _decompressed(self, index: int, block: np.ndarray, raw_size: int) -> np.ndarray:
        codec = _codec()
        if codec is None:
            raise RuntimeError(f"a shuffled piece holds {CODEC}-compressed frames, but this pyarrow has no "
                               f"{CODEC} codec: install the same pyarrow on every worker")
        try:
            return np.frombuffer(codec.decompress(block, decompressed_size=raw_size), dtype=np.uint8)
        except (OSError, pa.ArrowException) as error:
            raise ShuffledDataError(self._damage(index, f"it does not decompress ({error})")) from error

    def _damage(self, index: int, what: str) -> str:
        return (f"block {index} of {len(self.raw_sizes)} of a shuffled piece's frames ({int(self.raw_sizes[index])} "
                f"bytes unpacked): {what}: the runner delivered damaged bytes. Nothing is published; run the build "
                "again, and if it recurs, check the workers' memory and the runner's shuffle storage")


_EMPTY = PackedFrames(np.zeros(0, np.uint8), np.zeros(0, np.uint32), np.zeros(0, np.uint32), np.zeros(0, np.uint32), 0, 0)


def _starts(sizes: np.ndarray) -> np.ndarray:
    """The n + 1 offsets of blocks of ``sizes``, from 0."""
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    return starts


def pack_frames(frames: np.ndarray, block_bytes: int = BLOCK_BYTES) -> PackedFrames:
    """``frames`` (uint8) compressed in blocks of ``block_bytes``; a block compression does not shrink is kept raw."""
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if not frames.nbytes:
        return _EMPTY
    codec = _codec()
    view = memoryview(frames)  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
    blocks: list[bytes | memoryview] = []
    crcs: list[int] = []
    for start in range(0, frames.nbytes, block_bytes):
        raw = view[start:start + block_bytes]
        packed = codec.compress(raw, asbytes=True) if codec is not None else None
        blocks.append(packed if packed is not None and len(packed) < len(raw) * KEEP_RAW_ABOVE else raw)
        crcs.append(crc32c.crc32c(raw))
    raw_sizes = np.full(len(blocks), block_bytes, dtype=np.uint32)
    raw_sizes[-1] = frames.nbytes - block_bytes * (len(blocks) - 1)
    stored_sizes = np.fromiter(map(len, blocks), dtype=np.uint32, count=len(blocks))
    return PackedFrames(np.frombuffer(b"".join(blocks), dtype=np.uint8), stored_sizes, raw_sizes,
                        np.array(crcs, dtype=np.uint32), 0, frames.nbytes)
