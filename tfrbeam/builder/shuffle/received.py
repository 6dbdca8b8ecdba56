"""The records one shard writer received, read back through the piece store: whole parts in memory, spilled parts a
window at a time, framed block by block as they are written.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.builder.shuffle.pieces import Piece, StoredRecords
from tfrbeam.builder.shuffle.stores import PieceStore
from tfrbeam.tfrecord.frames import join_frames_in_buffers, payload_prefixes
from tfrbeam.tfrecord.records import RECORD_OVERHEAD

__all__ = ["SHARD_READ_BYTES", "Received", "adjacent_equal"]

# A shard writer reads the spilled parts of its shard this many bytes at a time in all (a window
# per part), so its memory does not grow with the shard.
SHARD_READ_BYTES = 32 << 20
# And at most this many bytes a part at a time: reading a window briefly holds a copy or two of it, so fewer,
# larger parts (a memory store's merged runs) must not make each window their whole share.
PART_WINDOW_MAX_BYTES = 4 << 20



class _PartWindows:
    """One spilled part of a shard's records, read ``window_bytes`` at a time.

    So a writer holds one window per spilled part, not the whole shard, whatever the dataset's
    size. The writer reads forward: its blocks take each part's records in key order.
    """

    def __init__(self, part: Piece, store: PieceStore, window_bytes: int):
        self._part, self._store, self._window_bytes = part, store, window_bytes
        self._first = self._end = 0
        self._records: StoredRecords | None = None

    def window(self, first: int, end: int) -> tuple[int, StoredRecords] | None:
        """Make the part's records ``first:end`` readable: the new window (its first record, its records) if one had
        to be read, None if the current one holds them (``starts`` index the window's ``buffer``)."""
        if self._records is not None and self._first <= first and end <= self._end:
            return None
        self._read(first, end)
        assert self._records is not None  # _read set it
        return self._first, self._records

    def _read(self, first: int, end: int) -> None:
        """The window of records ``first:end`` at least: what the current window holds of it is kept, the rest read.

        So each record is read (and checked, for a spill file) once, however the writer's blocks fall across windows.
        """
        part = self._part
        wanted = int(part.offsets[first]) + self._window_bytes
        end = max(end, min(len(part), int(np.searchsorted(part.offsets, wanted, side="right")) - 1))
        kept = self._kept_from(first)
        self._records = None  # the old window goes before the new one is read (but for what ``kept`` views of it)
        fresh = self._store.records(part.slice(first + (len(kept.starts) if kept is not None else 0), end))
        self._records = fresh if kept is None else _joined(kept, fresh)
        self._first, self._end = first, end

    def _kept_from(self, first: int) -> StoredRecords | None:
        """The current window's records from ``first`` on, a view of it (None when it holds none of them)."""
        records = self._records
        if records is None or not self._first <= first < self._end:
            return None
        skip = first - self._first
        low = int(records.starts[skip])  # the first kept payload's start: what comes after it stays whole
        return StoredRecords(np.asarray(records.buffer, dtype=np.uint8)[low:], records.starts[skip:] - low,
                             records.lengths[skip:], records.footers[skip:])


def _joined(kept: StoredRecords, fresh: StoredRecords) -> StoredRecords:
    """One window of the records of ``kept`` then those of ``fresh`` (payloads and footers as they were)."""
    offset = len(kept.buffer)
    return StoredRecords(np.concatenate([kept.buffer, np.asarray(fresh.buffer, dtype=np.uint8)]),  # one copy of each
                         np.concatenate([kept.starts, fresh.starts + offset]),
                         np.concatenate([kept.lengths, fresh.lengths]), np.concatenate([kept.footers, fresh.footers]))


class Received:
    """The records one shard writer received, addressed by a flat position across all parts, framed as they are written.

    Every part is a slice of a sorted piece, its records read through the piece store: a record
    is a payload slice, its length and its masked CRC (the frame's footer). A part its store
    holds in memory is addressed whole; a part in a file (spilled) is read a window at a time
    (``_PartWindows``), the windows of all parts sharing ``read_bytes``.
    """

    def __init__(self, parts: list[Piece], store: PieceStore, read_bytes: int | None = None):
        read_bytes = SHARD_READ_BYTES if read_bytes is None else read_bytes
        window_bytes = max(1, min(PART_WINDOW_MAX_BYTES, read_bytes // max(1, len(parts))))
        self._in_windows = np.array([store.read_in_windows(part) for part in parts], dtype=bool)
        # The most bytes of consecutive records (in key order) to ask ``frames`` for at once: one window's worth
        # when some part is read in windows, so the windows stay within ``read_bytes``; unbounded otherwise.
        self.read_bound = window_bytes if self._in_windows.any() else None
        self._windows = {index: _PartWindows(part, store, window_bytes)
                         for index, part in enumerate(parts) if self._in_windows[index]}
        counts = np.array([len(part) for part in parts], dtype=np.int64)
        self._part_first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.views: list[memoryview | None] = [None] * len(parts)
        total = int(counts.sum())
        self.keys = np.concatenate([part.key for part in parts]) if parts else np.zeros(0, np.uint64)
        self.part_of = np.repeat(np.arange(len(parts)), counts) if parts else np.zeros(0, np.int64)
        self.lengths = np.zeros(total, np.int64)
        self.starts = np.zeros(total, np.int64)  # of whole parts; of windowed ones, set window by window
        self.footers = np.zeros(total, "<u4")
        self.prefixes = np.zeros(total, "<u4")  # payload_prefixes, read once per part or window, not per block
        for index, part in enumerate(parts):
            first, end = int(self._part_first[index]), int(self._part_first[index + 1])
            self.lengths[first:end] = part.framed_lengths - RECORD_OVERHEAD
            if not self._in_windows[index]:
                stored = store.records(part)
                self.views[index] = memoryview(np.ascontiguousarray(stored.buffer, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
                self.starts[first:end] = stored.starts
                self.footers[first:end] = stored.footers
                self.prefixes[first:end] = payload_prefixes(stored.buffer, stored.starts, stored.lengths)

    def frame(self, position: int) -> bytes:
        """One record's whole frame (to order records with equal keys by their bytes)."""
        return bytes(self.frames(np.array([position], dtype=np.int64)))

    def payload_lengths(self, positions: np.ndarray) -> np.ndarray:
        return self.lengths[positions]

    def frames(self, positions: np.ndarray) -> bytes | memoryview:
        """The frames of the records at ``positions``, in that order, as one buffer."""
        part_of = self.part_of[positions]
        if self._in_windows.any():
            self._read_windows(positions, part_of)
        # every part's view these positions touch is set (whole, or by _read_windows)
        return join_frames_in_buffers(self.views, part_of, self.starts[positions], self.lengths[positions],
                                      self.footers[positions], self.prefixes[positions])

    def same_as_previous(self, positions: np.ndarray) -> np.ndarray:
        """For each ``i``, whether the record at ``positions[i]`` is byte-identical to the one at ``positions[i - 1]``.

        Equal payloads mean equal frames. The payloads are gathered and compared by Arrow, no call
        per record. The positions must fit the read windows together, as a ``read_bound`` of
        consecutive records does.
        """
        same = np.zeros(len(positions), dtype=bool)
        if len(positions) > 1:
            payloads = self._payloads(positions)
            same[1:] = adjacent_equal(payloads)
        return same

    def _payloads(self, positions: np.ndarray) -> pa.LargeBinaryArray:
        """The payloads of the records at ``positions``, in that order, copied into one Arrow array.

        Each part's buffer is read as one Arrow array alternating the wanted payloads and the bytes
        between them (payloads do not overlap, so sorted by start, an empty one first, their bounds
        never decrease); Arrow takes every other element of each, then puts them in order.
        """
        part_of = self.part_of[positions]
        if self._in_windows.any():
            self._read_windows(positions, part_of)
        starts, lengths = self.starts[positions], self.lengths[positions]
        by_start = np.lexsort((lengths, starts, part_of))  # by part, then by start within it
        bounds = np.empty(2 * len(positions), dtype=np.int64)
        bounds[0::2] = starts[by_start]
        bounds[1::2] = starts[by_start] + lengths[by_start]
        firsts = np.flatnonzero(np.r_[True, np.diff(part_of[by_start]) != 0])  # each part's first, in by_start
        decreasing = bounds[1:] < bounds[:-1]
        decreasing[2 * firsts[1:] - 1] = False  # one part's last end, the next part's first start
        if decreasing.any():
            raise RuntimeError("a shard writer's received records overlap in their buffer; the piece store is corrupt")
        every_other = pa.array(np.arange(0, 2 * len(positions), 2, dtype=np.int64))
        taken = []
        for first, end in zip(firsts.tolist(), [*firsts[1:].tolist(), len(positions)]):
            view = self.views[int(part_of[by_start[first]])]
            assert view is not None  # every part's view is set (whole, or by _read_windows)
            spans = pa.Array.from_buffers(pa.large_binary(), 2 * (end - first) - 1,
                                          [None, pa.py_buffer(bounds[2 * first:2 * end]), pa.py_buffer(view)])
            taken.append(spans.take(every_other.slice(0, end - first)))
        where = np.empty(len(positions), dtype=np.int64)
        where[by_start] = np.arange(len(positions))
        return pa.concat_arrays(taken).take(pa.array(where))

    def _read_windows(self, positions: np.ndarray, part_of: np.ndarray) -> None:
        """Read the windows of the spilled parts that ``positions`` need; point their views, starts and footers there.

        A window's starts and footers are set for all its records when it is read, so a block whose records
        the current windows hold costs one comparison per part, not an index per record.
        """
        windowed = np.flatnonzero(self._in_windows[part_of])
        if not windowed.size:
            return
        by_part = windowed[np.argsort(part_of[windowed], kind="stable")]
        parts = part_of[by_part]
        local = positions[by_part] - self._part_first[parts]
        group_starts = np.flatnonzero(np.r_[True, parts[1:] != parts[:-1]])
        lowest = np.minimum.reduceat(local, group_starts).tolist()
        highest = np.maximum.reduceat(local, group_starts).tolist()
        for part, first, last in zip(parts[group_starts].tolist(), lowest, highest):
            read = self._windows[part].window(first, last + 1)
            if read is not None:
                window_first, stored = read
                base = int(self._part_first[part]) + window_first
                self.starts[base:base + len(stored.starts)] = stored.starts
                self.footers[base:base + len(stored.footers)] = stored.footers
                self.prefixes[base:base + len(stored.starts)] = payload_prefixes(stored.buffer, stored.starts, stored.lengths)
                self.views[part] = memoryview(np.ascontiguousarray(stored.buffer, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+


def adjacent_equal(values: pa.Array) -> np.ndarray:
    """For each value of ``values`` after the first, whether it is byte-identical to the one before (Arrow's memcmp)."""
    return pc.equal(values[:-1], values[1:]).to_numpy(zero_copy_only=False)
