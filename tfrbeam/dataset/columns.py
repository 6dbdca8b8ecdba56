"""Columnar batches in flight: nested value arrays with row lengths, and the shuffle buffer over them.

Inside the reader every feature of a block of records is a ``Column``: a flat ``leaf`` array plus
zero or more levels of lengths (outermost first). A fixed-shape numeric feature has no levels
(``leaf`` is ``[rows, *shape]``); a variable-length numeric feature has one (values per row); a
bytes feature keeps its bytes in a ``uint8`` leaf with a last level of byte lengths per value (raw records
are an exception: a leaf of ``bytes`` objects, one per row, which is what the caller gets).
That form concatenates by concatenating arrays, gathers rows with vectorised index arithmetic
and crosses process boundaries as a few numpy buffers (no Python object per value).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from tfrbeam.codec.wire import ranges


class Ragged(NamedTuple):
    """A batch of variable-length rows: ``values`` back to back and each row's length.

    Row ``i`` is ``values[offsets[i]:offsets[i + 1]]``. A NamedTuple, so PyTorch's default
    collate/convert and JAX tree utilities treat it as a container of two arrays. For a
    feature list whose steps vary in length, ``values`` is itself a Ragged (of the steps).
    """

    values: np.ndarray | Ragged
    lengths: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        """Row start offsets into ``values``, n + 1 of them."""
        return row_offsets(self.lengths)

    @property
    def num_rows(self) -> int:
        return len(self.lengths)

    def row(self, index: int) -> np.ndarray | Ragged:
        """Row ``index``: an array, or a Ragged of its steps when ``values`` is Ragged."""
        offsets = self.offsets
        begin, end = int(offsets[index]), int(offsets[index + 1])
        if isinstance(self.values, Ragged):
            inner, flat = self.values.offsets, self.values.values
            assert isinstance(flat, np.ndarray)  # two levels at most: steps, then their values
            return Ragged(flat[int(inner[begin]):int(inner[end])], self.values.lengths[begin:end])
        return self.values[begin:end]

    def to_list(self) -> list[np.ndarray | Ragged]:
        """Every row as its own array (slow: for inspection and tests)."""
        return [self.row(index) for index in range(len(self.lengths))]

    def to_padded(self, length: int | None = None, pad_value: object = None) -> np.ndarray:
        """Dense ``[rows, length]`` array, truncating longer rows and padding shorter ones.

        ``length`` defaults to the longest row; ``pad_value`` to 0, 0.0 or b"" by dtype. Nested
        values are padded to their longest row first (``[rows, length, longest step]``).
        """
        values = self.values.to_padded(None, pad_value) if isinstance(self.values, Ragged) else self.values
        return pad_rows(values, self.lengths, length, pad_value)


def pad_rows(values: np.ndarray, lengths: np.ndarray, length: int | None, pad_value: object = None) -> np.ndarray:
    """Rows given as flat values plus lengths, as a dense array padded (or cut) to ``length``.

    Values may have trailing dimensions (a step's shape): the result is ``[rows, length, *rest]``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    width = int(lengths.max()) if length is None and len(lengths) else int(length or 0)
    if pad_value is None:
        pad_value = b"" if values.dtype == object else 0
    out = np.full((len(lengths), width, *values.shape[1:]), pad_value, dtype=values.dtype)
    kept = np.minimum(lengths, width)
    column = ranges(np.zeros(len(lengths), dtype=np.int64), kept)
    row = np.repeat(np.arange(len(lengths), dtype=np.int64), kept)
    out[row, column] = values[ranges(row_offsets(lengths)[:-1], kept)]
    return out


@dataclasses.dataclass(frozen=True)
class Column:
    """One feature of a block of rows: ``leaf`` values and the lengths of each nesting level."""

    leaf: np.ndarray
    levels: tuple[np.ndarray, ...] = ()

    @property
    def num_rows(self) -> int:
        return len(self.levels[0]) if self.levels else len(self.leaf)

    def take(self, rows: np.ndarray) -> Column:
        """The rows at positions ``rows`` (any order, repeats allowed)."""
        index = np.asarray(rows, dtype=np.int64)
        if not self.levels:
            return Column(self.leaf[index])
        levels = []
        for lengths in self.levels[:-1]:
            taken = lengths[index]
            levels.append(taken)
            index = ranges(row_offsets(lengths)[:-1][index], taken)
        leaf, lengths = gather_values(self.leaf, row_offsets(self.levels[-1]), index)
        return Column(leaf, (*levels, lengths))

    def slice(self, start: int, stop: int) -> Column:
        """Rows ``start:stop`` without an index array."""
        levels = []
        for lengths in self.levels:
            offsets = row_offsets(lengths)
            levels.append(lengths[start:stop])
            start, stop = int(offsets[start]), int(offsets[stop])
        return Column(self.leaf[start:stop], tuple(levels))


def gather_values(leaf: np.ndarray, offsets: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the values of entries ``index`` back to back, each entry's length); entry i is ``leaf[offsets[i]:offsets[i + 1]]``.

    Bytes are copied a value at a time by Arrow's take: numpy would need an index per byte,
    which costs more than the bytes (a raw record is hundreds of them). The result may be
    read-only (Arrow's memory).
    """
    starts = offsets[index]
    lengths = offsets[index + 1] - starts
    if leaf.dtype != np.uint8 or leaf.ndim != 1 or not len(index):
        return leaf[ranges(starts, lengths)], lengths
    entries = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(offsets) - 1,
        [None, pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int64)), pa.py_buffer(np.ascontiguousarray(leaf))],
    )
    taken = entries.take(pa.array(index))
    _, taken_offsets, data = taken.buffers()
    if data is None:
        return np.zeros(0, dtype=np.uint8), lengths
    bounds = np.frombuffer(taken_offsets, dtype=np.int64)[taken.offset:taken.offset + len(taken) + 1]
    return np.frombuffer(data, dtype=np.uint8)[int(bounds[0]):int(bounds[-1])], lengths


def concat_columns(columns: list[Column]) -> Column:
    """Rows of several columns of the same feature, one after another."""
    if len(columns) == 1:
        return columns[0]
    depth = len(columns[0].levels)
    levels = tuple(np.concatenate([column.levels[level] for column in columns]) for level in range(depth))
    return Column(np.concatenate([column.leaf for column in columns]), levels)


Block = dict  # feature name -> Column, every column with the same number of rows

PACKED_KEY = "__dense__"


@dataclasses.dataclass(frozen=True)
class DenseLayout:
    """Packs every fixed-shape numeric column of a block into one row-major byte matrix.

    Moving a block's dense features as one ``[rows, row bytes]`` uint8 matrix makes every
    gather, swap and pickle one numpy call instead of one per feature (the shuffle buffer's hot
    path); a structured dtype view of it splits it back into columns.
    """

    fields: tuple[tuple[str, str, tuple[int, ...]], ...]  # (name, dtype, shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(name, dtype, shape) for name, dtype, shape in self.fields])

    def pack(self, block: Block) -> Block:
        """The block with its dense columns moved into one structured array under ``PACKED_KEY``."""
        if not self.fields:
            return block
        out = dict(block)
        rows = out[self.fields[0][0]].num_rows
        dtype = self.dtype
        records = np.empty(rows, dtype=dtype)
        for name, _, _ in self.fields:
            records[name] = out.pop(name).leaf
        out[PACKED_KEY] = Column(records.view(np.uint8).reshape(rows, dtype.itemsize))
        return out

    def unpack(self, block: Block) -> Block:
        """The block with the packed records split back into contiguous columns."""
        if PACKED_KEY not in block:
            return block
        out = dict(block)
        matrix = out.pop(PACKED_KEY).leaf
        records = np.ascontiguousarray(matrix).view(self.dtype).reshape(len(matrix))
        for name, _, _ in self.fields:
            out[name] = Column(np.ascontiguousarray(records[name]))
        return out


def block_rows(block: Block) -> int:
    return next(iter(block.values())).num_rows


def take_block(block: Block, rows: np.ndarray) -> Block:
    return {name: column.take(rows) for name, column in block.items()}


def slice_block(block: Block, start: int, stop: int) -> Block:
    return {name: column.slice(start, stop) for name, column in block.items()}


def concat_blocks(blocks: list[Block]) -> Block:
    if len(blocks) == 1:
        return blocks[0]
    return {name: concat_columns([block[name] for block in blocks]) for name in blocks[0]}


def row_offsets(lengths: np.ndarray) -> np.ndarray:
    """Arrow-style offsets of rows of ``lengths``: ``[0, l0, l0 + l1, ..., total]`` as int64 (one more than rows)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


class RowQueue:
    """First in, first out: blocks go in, batches of any size come out in arrival order."""

    def __init__(self) -> None:
        self._blocks: list[Block] = []
        self._head = 0  # rows of self._blocks[0] already taken
        self.size = 0

    def add(self, block: Block) -> None:
        rows = block_rows(block)
        if rows:
            self._blocks.append(block)
            self.size += rows

    def snapshot(self) -> Block:
        """Every row held, in order, without removing any."""
        return _rows_from(self._blocks, self._head)

    def pop(self, count: int) -> Block:
        pieces: list[Block] = []
        needed = min(count, self.size)
        while needed:
            block = self._blocks[0]
            rows = block_rows(block)
            take = min(needed, rows - self._head)
            pieces.append(block if take == rows else slice_block(block, self._head, self._head + take))
            self._head += take
            needed -= take
            self.size -= take
            if self._head == rows:
                self._blocks.pop(0)
                self._head = 0
        return concat_blocks(pieces)


def _rows_from(blocks: list[Block], head: int) -> Block:
    first = slice_block(blocks[0], head, block_rows(blocks[0]))
    return concat_blocks([first] + blocks[1:])


class _PooledColumn:
    """One feature inside the shuffle pool: fixed-shape values by slot, nested rows as entries of arenas.

    A nested column keeps each level as an append-only arena of entries, stored as offsets into
    the next level (or the leaf), and each slot holds its row's level-0 entry: removing a row
    moves one number, and a gather copies each value's bytes whole (``gather_values``) instead
    of indexing them one by one. Arenas are compacted to the live rows when one fills up
    (amortised O(1) per row).
    """

    def __init__(self, template: Column, slots: int):
        self.depth = len(template.levels)
        if self.depth == 0:
            self.leaf = np.empty((slots,) + template.leaf.shape[1:], dtype=template.leaf.dtype)
            return
        self.entries = np.empty(slots, dtype=np.int64)  # each slot's entry in the level-0 arena
        self.offsets = [np.zeros(1, dtype=np.int64) for _ in range(self.depth)]  # arena k: offsets[k][:fill[k] + 1]
        self.fill = [0] * self.depth
        self.leaf = np.empty((0,) + template.leaf.shape[1:], dtype=template.leaf.dtype)
        self.leaf_fill = 0

    def put(self, slot: int, column: Column, live: int) -> None:
        """Store ``column``'s rows in slots ``slot:slot + rows``; ``live`` slots before it are in use."""
        rows = column.num_rows
        if self.depth == 0:
            self.leaf[slot:slot + rows] = column.leaf
            return
        if not self._fits(column):
            self._rebuild(live, column)
        self.entries[slot:slot + rows] = np.arange(self.fill[0], self.fill[0] + rows, dtype=np.int64)
        for level, lengths in enumerate(column.levels):
            begin, offsets = self.fill[level], self.offsets[level]
            ends = offsets[begin + 1:begin + 1 + len(lengths)]
            np.cumsum(lengths, out=ends)
            ends += offsets[begin]
            self.fill[level] = begin + len(lengths)
        self.leaf[self.leaf_fill:self.leaf_fill + len(column.leaf)] = column.leaf
        self.leaf_fill += len(column.leaf)

    def _fits(self, column: Column) -> bool:
        if self.leaf_fill + len(column.leaf) > len(self.leaf):
            return False
        return all(self.fill[level] + len(column.levels[level]) < len(self.offsets[level]) for level in range(self.depth))

    def _rebuild(self, live: int, incoming: Column) -> None:
        """Compact the arenas to the live rows and make room (doubling) for ``incoming``.

        The live rows are copied out, then back into the same arenas when they are large enough: fresh
        arrays each time cost a page fault per 4 KiB written (some 230 MB of new pages a raw epoch of the
        object-store benchmark), and no batch refers to an arena (``take`` copies).
        """
        current = self.take(np.arange(live, dtype=np.int64)) if live else None
        for level in range(self.depth):
            need = (len(current.levels[level]) if current is not None else 0) + len(incoming.levels[level])
            if len(self.offsets[level]) < 3 * need // 2 + 1:  # reused with room for half as much again: amortised
                self.offsets[level] = np.zeros(max(2 * need, 1024) + 1, dtype=np.int64)
            self.fill[level] = 0  # offsets[level][0] stays 0: put writes only the entries after it
        need = (len(current.leaf) if current is not None else 0) + len(incoming.leaf)
        if len(self.leaf) < 3 * need // 2:
            self.leaf = np.empty((max(2 * need, 4096),) + self.leaf.shape[1:], dtype=self.leaf.dtype)
        self.leaf_fill = 0
        if current is not None:
            self.put(0, current, 0)

    def take(self, slots: np.ndarray) -> Column:
        if self.depth == 0:
            return Column(np.take(self.leaf, slots, axis=0))
        index = self.entries[slots]
        levels = []
        for level in range(self.depth - 1):
            offsets = self.offsets[level]
            starts = offsets[index]
            lengths = offsets[index + 1] - starts
            levels.append(lengths)
            index = ranges(starts, lengths)
        last = self.offsets[-1][:self.fill[-1] + 1]
        leaf, lengths = gather_values(self.leaf[:self.leaf_fill], last, index)
        return Column(leaf, (*levels, lengths))

    def move(self, holes: np.ndarray, movers: np.ndarray) -> None:
        if self.depth == 0:
            self.leaf[holes] = np.take(self.leaf, movers, axis=0)
        else:
            self.entries[holes] = self.entries[movers]


class ShufflePool:
    """A shuffle buffer of rows: blocks go in, uniformly random rows come out, a batch at a time.

    Like tf.data's shuffle buffer, each row that leaves is drawn uniformly from the rows held
    (at least ``capacity`` of them until the input runs dry); drawing a whole batch at once
    (without replacement) keeps it vectorised. All draws come from ``rng``, so the output
    order is a pure function of the input order and the seed.
    """

    def __init__(self, capacity: int, rng: np.random.Generator):
        self.capacity = capacity
        self.rng = rng
        self.size = 0
        self._columns: dict[str, _PooledColumn] | None = None
        self._slots = 0

    def add(self, block: Block) -> None:
        rows = block_rows(block)
        if not rows:
            return
        if self._columns is None:
            self._slots = self.capacity + rows
            self._columns = {name: _PooledColumn(column, self._slots) for name, column in block.items()}
        if self.size + rows > self._slots:
            self._grow(self.size + rows)
        for name, column in block.items():
            self._columns[name].put(self.size, column, self.size)
        self.size += rows

    def _grow(self, needed: int) -> None:
        """More slots (rare: only when blocks are larger than the ones the pool was sized for)."""
        assert self._columns is not None
        live = {name: pooled.take(np.arange(self.size, dtype=np.int64)) for name, pooled in self._columns.items()}
        self._slots = max(needed, 2 * self._slots)
        self._columns = {name: _PooledColumn(column, self._slots) for name, column in live.items()}
        for name, column in live.items():
            self._columns[name].put(0, column, 0)

    def snapshot(self) -> Block:
        """Every row held, slot by slot, without drawing (the random stream is untouched)."""
        assert self._columns is not None
        slots = np.arange(self.size, dtype=np.int64)
        return {name: pooled.take(slots) for name, pooled in self._columns.items()}

    def pop(self, count: int) -> Block:
        """Remove ``count`` rows drawn uniformly without replacement, in the order drawn."""
        assert self._columns is not None
        count = min(count, self.size)
        picked = self.rng.choice(self.size, size=count, replace=False) if count < self.size else self.rng.permutation(self.size)
        picked = picked.astype(np.int64, copy=False)
        out = {name: pooled.take(picked) for name, pooled in self._columns.items()}
        # Fill the holes below the new end with the surviving rows above it (swap-remove).
        end = self.size - count
        holes = picked[picked < end]
        tail_kept = np.ones(count, dtype=bool)
        tail_kept[picked[picked >= end] - end] = False
        movers = np.flatnonzero(tail_kept) + end
        if len(holes):
            for pooled in self._columns.values():
                pooled.move(holes, movers)
        self.size = end
        return out
