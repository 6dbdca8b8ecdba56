"""Where prepared pieces wait for the shard writers: in the elements (inline), in spill files (spill) or in this
process's memory (memory), behind one small interface (``PieceStore``: ``add`` a piece, ``records`` of a slice).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
import typing
import uuid

import numpy as np

from tfrbeam.beam import filesystem as fs
from tfrbeam.builder.shuffle import held as spilling
from tfrbeam.builder.shuffle.keys import key_range_bounds, occurrence_keys, payload_crcs
from tfrbeam.builder.shuffle.packed import pack_frames
from tfrbeam.builder.shuffle.pieces import (
    INLINE,
    MEMORY,
    PIECE_STORES,
    SPILL,
    KeyedRecords,
    MovedCopies,
    Piece,
    PieceRef,
    StoredRecords,
    byte_blocks,
    frame_footers,
    split_key_order,
)
from tfrbeam.errors import ShuffledDataError
from tfrbeam.tfrecord.blocks import first_damaged_record
from tfrbeam.tfrecord.frames import join_frames_in_buffers, payload_prefixes
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, mask_crcs

__all__ = [
    "SPILL_DIR_NAME", "InlineStore", "MemoryStore", "PieceStore", "SpillStore", "discard_pieces", "is_registered",
    "make_piece_store", "registered_piece", "runs_holding_pieces",
]

SPILL_DIR_NAME = "spill"
# A spill store's worker gathers about this many bytes of pieces into one run (with ``merge_runs``).
SPILL_RUN_BYTES = 128 << 20
# A merged run is framed and written this many bytes (and at most this many records) at a time.
_RUN_BLOCK_BYTES, _RUN_BLOCK_RECORDS = 8 << 20, 8192
# Spilled frames read back are checked this many bytes at a time (the check copies what it checks).
_CHECK_BLOCK_BYTES = 4 << 20
_CHECK_NAMES = {"length": "length (not the one its piece recorded)", "length_crc": "length CRC", "data_crc": "data CRC"}



class PieceStore:
    """Where prepared pieces wait for the shard writers, behind ``add`` and ``records`` (as TFDS's Shuffler).

    A store is chosen once, when the build is planned (``tfrbeam.builder.pipeline.runners.choose_piece_store``),
    and is pickled into the DoFns that prepare pieces and write shards; ``open`` / ``flush`` /
    ``close`` bracket its use inside one worker (DoFn setup, finish_bundle, teardown).
    """

    name: typing.ClassVar[str]
    # Pieces carry no bytes and every worker sees the store: writers may take all pieces as a side input.
    pieces_as_side_input: typing.ClassVar[bool] = False
    # PreparePieces gathers about this many bytes of pieces and keeps them as one run (``add_run``); 0: each alone.
    run_bytes: int = 0
    # The tally of copies gets whole pieces and reads each key range of the runs they are in (``range_parts``),
    # not the parts ``tally_part`` cut when they were prepared: the store merges pieces into runs after that.
    tallies_whole_runs: typing.ClassVar[bool] = False

    def open(self) -> None:
        """Prepare to ``add`` in this worker."""

    def add(self, records: KeyedRecords) -> Piece:
        """Keep a piece's records, ordered by (split, key); the piece that finds them again.

        The default frames them into one new buffer (``KeyedRecords.sorted_frames``) and keeps that.
        """
        split, key, offsets, frames = records.sorted_frames()
        return Piece(split, key, offsets, self._keep(frames), frame_footers(frames, offsets))

    def add_run(self, pieces: list[KeyedRecords]) -> Piece:
        """Keep several pieces' records as one piece, in (split, key) order: the stores with a ``run_bytes``."""
        raise NotImplementedError(f"{type(self).__name__} keeps each piece alone")

    def _keep(self, frames: np.ndarray) -> PieceRef:
        """Keep one piece's framed bytes; the stores that keep frames (inline, spill) implement it.

        The memory store keeps payloads where the encoder put them and overrides ``add`` instead.
        """
        raise NotImplementedError(f"{type(self).__name__} keeps no framed bytes: it overrides add()")

    def flush(self) -> None:
        """Every piece added so far can be read by other workers (end of a bundle)."""

    def close(self) -> None:
        """This worker adds no more."""

    def records(self, piece: Piece) -> StoredRecords:
        """The records of ``piece`` (a slice of an added piece), in order."""
        return StoredRecords.of_frames(piece, self._frames(piece))

    def _frames(self, piece: Piece) -> np.ndarray:
        """The framed bytes ``_keep`` kept for ``piece``; the memory store overrides ``records`` instead."""
        raise NotImplementedError(f"{type(self).__name__} keeps no framed bytes: it overrides records()")

    def read_in_windows(self, piece: Piece) -> bool:
        """Whether a writer should read ``piece``'s records a window at a time (they are in a file), not all at once."""
        return False

    def routed(self, piece: Piece, slices: int) -> None:
        """``piece`` was cut into ``slices`` shard slices (a piece may be routed again: only the first call counts)."""

    def written(self, piece: Piece, shard_key: int) -> None:
        """The slice ``piece`` of shard ``shard_key`` was written."""

    def shard_written(self, shard_key: int, num_shards: int) -> None:
        """Shard ``shard_key``, one of the plan's ``num_shards``, is written."""

    def runs_of(self, pieces: list[Piece]) -> list[Piece]:
        """What the shard writers read for ``pieces``: the pieces themselves, or the runs the store merged them into."""
        return pieces

    def with_keys(self, piece: Piece) -> Piece:
        """``piece`` (one ``runs_of`` gave) with its keys, splits and frame offsets in memory, to route it."""
        return piece

    def slice_of(self, piece: Piece, start: int, end: int) -> Piece:
        """Records ``start:end`` of ``piece`` (one ``runs_of`` gave), as ``Piece.slice`` cuts them."""
        return piece.slice(start, end)

    def crossing(self, piece: Piece) -> Piece:
        """``piece`` (or a slice ``route_slice`` cut) as it crosses the runner's GroupByKey; ``with_keys`` undoes it."""
        return piece.without_footers()

    def route_slice(self, piece: Piece, start: int, end: int) -> Piece:
        """Records ``start:end`` of a piece being routed (``with_keys`` gave it), as they cross to their shard writer."""
        return piece.slice(start, end).without_footers()

    def tally_part(self, piece: Piece, start: int, end: int) -> Piece:
        """Records ``start:end`` of a prepared piece as they cross to the tally of copies: keys and footers, no frames
        (``with_keys`` gives them back)."""
        return piece.slice(start, end).keys_only()

    def range_parts(self, piece: Piece, range_index: int, range_bits: int) -> list[tuple[int, Piece]]:
        """The records of key range ``range_index`` of ``piece`` (one ``runs_of`` gave), with keys and footers: (first
        record, part) for each split that has some (the stores with ``tallies_whole_runs``)."""
        raise NotImplementedError(f"{type(self).__name__} tallies the parts tally_part cut")

    def rekeyed(self, piece: Piece, moved: typing.Mapping[str, typing.Iterable[MovedCopies]]) -> Piece:
        """``piece`` (one ``runs_of`` gave) after the tally of copies gave some of its records new keys (``moved``, by
        piece name: a side input) in (split, key) order again, kept in this store as ``runs_of`` gives pieces. The
        stores that keep frames frame them again in the new order."""
        piece = self.with_keys(piece)
        keys = piece.key.copy()
        for copies in moved[piece.ref.location]:
            keys[copies.positions] = occurrence_keys(piece.key[copies.positions], copies.occurrences)
        return self._reordered(piece, keys)

    def _reordered(self, piece: Piece, keys: np.ndarray) -> Piece:
        """The records of ``piece`` with ``keys``, framed again into one new buffer in (split, key) order and kept."""
        stored = self.records(piece)
        order = split_key_order(piece.split, keys)
        lengths, footers = stored.lengths[order], stored.footers[order]
        view = memoryview(np.ascontiguousarray(stored.buffer, dtype=np.uint8))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
        frames = join_frames_in_buffers([view], np.zeros(len(order), np.int64), stored.starts[order], lengths, footers)
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths + RECORD_OVERHEAD, out=offsets[1:])
        ref = self._keep(np.frombuffer(frames, dtype=np.uint8))
        return Piece(piece.split[order], keys[order], offsets, ref, np.ascontiguousarray(footers, dtype="<u4"))


@dataclasses.dataclass(frozen=True)
class _RunMember:
    """Records to merge into a run: per record its split, key, payload start and length in ``payloads``, masked CRC."""

    split: np.ndarray
    key: np.ndarray
    payloads: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    footers: np.ndarray

    @classmethod
    def of(cls, records: KeyedRecords) -> _RunMember:
        crcs = records.crcs if records.crcs is not None else payload_crcs(records.data, records.offsets)
        return cls(records.split, records.key, records.data, records.offsets[:-1], records.lengths,
                   mask_crcs(crcs).astype("<u4"))


def write_run(path: str, members: list[_RunMember]) -> Piece:
    """Frame the members' records into the file ``path`` in (split, key) order: one spilled piece of them all.

    Framed a block at a time from where the payloads are (no copy of the run is held), one thread
    writing each block while the next is framed (``write_spill_file``).
    """
    split, key = np.concatenate([m.split for m in members]), np.concatenate([m.key for m in members])
    order = split_key_order(split, key)
    member_of = np.repeat(np.arange(len(members)), [len(m.key) for m in members])[order]
    starts = np.concatenate([m.starts for m in members])[order]
    lengths = np.concatenate([m.lengths for m in members])[order]
    footers = np.concatenate([m.footers for m in members])[order]
    payloads = [np.ascontiguousarray(m.payloads, dtype=np.uint8) for m in members]
    prefixes = np.concatenate([payload_prefixes(data, m.starts, m.lengths) for data, m in zip(payloads, members)])[order]
    views = [memoryview(data) for data in payloads]  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+
    blocks = (join_frames_in_buffers(views, member_of[low:high], starts[low:high], lengths[low:high], footers[low:high],
                                     prefixes[low:high])
              for low, high in byte_blocks(lengths + RECORD_OVERHEAD, _RUN_BLOCK_BYTES, _RUN_BLOCK_RECORDS))
    spilling.write_spill_file(path, blocks, overlap=True)
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths + RECORD_OVERHEAD, out=offsets[1:])
    return Piece(split[order], key[order], offsets, PieceRef(SPILL, location=path), footers)


class InlineStore(PieceStore):
    """The frames travel in the elements, through the runner's GroupByKey (distributed runners shuffle them well),
    compressed in blocks (``pack_frames``): Dataflow bills its shuffle by the byte, and they cross it twice."""

    name = INLINE

    def _keep(self, frames: np.ndarray) -> PieceRef:
        # A name, so that the tally of copies can give the piece's moved copies their keys (``MovedCopies.location``).
        return PieceRef(INLINE, location=uuid.uuid4().hex, packed=pack_frames(frames))

    def _frames(self, piece: Piece) -> np.ndarray:
        return piece.ref.frames()

    def read_in_windows(self, piece: Piece) -> bool:
        """Packed frames are decompressed a window at a time, so a writer holds its shard compressed."""
        return piece.ref.packed is not None


class SpillStore(PieceStore):
    """The frames go to files under ``directory``; only keys and offsets cross the runner.

    Files are written by one background thread (the write releases the GIL and overlaps with
    preparing the next piece; at most one more piece waits) and are complete when the bundle
    finishes. Writers read them after a GroupByKey or as a side input, so always in a later stage.
    """

    name = SPILL

    def __init__(self, directory: str, run_bytes: int = 0, keys_beside: bool = True):
        self.directory = directory
        self.run_bytes = run_bytes
        self.keys_beside = keys_beside  # a memory store's overflow writes its own (``_HeldPieces.keys_to_disk``)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: list[concurrent.futures.Future] = []

    def __getstate__(self) -> dict:
        return {"directory": self.directory, "run_bytes": self.run_bytes, "keys_beside": self.keys_beside}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["directory"], state.get("run_bytes", 0), state.get("keys_beside", True))  # type: ignore[misc]  # unpickling rebuilds the fresh, unpicklable state

    def add(self, records: KeyedRecords) -> Piece:
        """The piece's frames and, beside them, its keys (``_write_keys``), written by the background thread."""
        split, key, offsets, frames = records.sorted_frames()
        if self._executor is None:
            self.open()
        assert self._executor is not None  # open() made it
        piece = Piece(split, key, offsets, PieceRef(SPILL, location=spilling.spill_path(self.directory, ".bin")),
                      frame_footers(frames, offsets))
        self._wait(keep=1)
        self._pending.append(self._executor.submit(_write_piece, piece, frames, self._keys_beside(piece)))
        return piece

    def add_run(self, pieces: list[KeyedRecords]) -> Piece:
        """The pieces' records framed into one spill file in (split, key) order: a writer reads one part of it."""
        path = spilling.spill_path(self.directory, ".bin")
        piece = write_run(path, [_RunMember.of(records) for records in pieces])
        if self._keys_beside(piece):
            _write_keys(piece)
        return piece

    def _keys_beside(self, piece: Piece) -> bool:
        """Whether a piece's keys go to a file beside its frames, to cross the runner without them: on a local disk,
        where reading them back is a page-cache copy (a bucket would charge a request for each slice)."""
        return self.keys_beside and bool(len(piece)) and not piece.ref.run and fs.is_local(piece.ref.location)

    def crossing(self, piece: Piece) -> Piece:
        """A whole spilled piece whose keys are beside it crosses as a stub: the runner holds no array of its records
        (12 bytes a record otherwise, held in the runner's process once per GroupByKey until the build ends)."""
        if piece.is_stub or not self._keys_beside(piece) or piece.ref.offset:
            return piece.without_footers()
        return Piece.stub(piece.ref, len(piece), 0, len(piece))

    def route_slice(self, piece: Piece, start: int, end: int) -> Piece:
        if not self._keys_beside(piece) or piece.ref.offset:
            return piece.slice(start, end).without_footers()
        return Piece.stub(piece.ref, len(piece), start, end)

    def tally_part(self, piece: Piece, start: int, end: int) -> Piece:
        """A stub when the piece's keys (and footers) are in the file beside it."""
        if not self._keys_beside(piece) or piece.ref.offset:
            return super().tally_part(piece, start, end)
        return Piece.stub(piece.ref, len(piece), start, end)

    def _reordered(self, piece: Piece, keys: np.ndarray) -> Piece:
        """The records framed again into a new spill file in their new order, a block at a time (``write_run``).

        Read without the check ``records`` makes: each payload keeps its CRC from the old file (lengths come from
        the keys), so the shard writers' check of the new file finds any damage to the old one.
        """
        stored = self.unchecked_records(piece)
        path = spilling.spill_path(self.directory, ".bin")
        member = _RunMember(piece.split, keys, stored.buffer, stored.starts, stored.lengths, stored.footers)
        reordered = write_run(path, [member])
        if self._keys_beside(reordered):
            _write_keys(reordered)
        return reordered

    def with_keys(self, piece: Piece) -> Piece:
        if not piece.is_stub:
            return piece
        assert piece.ref.keys_on_disk is not None  # is_stub says so
        count, first, end = piece.ref.keys_on_disk
        return _read_keys(dataclasses.replace(piece.ref, keys_on_disk=None), count, first, end)

    def open(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfrbeam-spill")

    def flush(self) -> None:
        self._wait(keep=0)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _wait(self, keep: int) -> None:
        while len(self._pending) > keep:
            self._pending.pop(0).result()

    def read_in_windows(self, piece: Piece) -> bool:
        return True

    def unchecked_records(self, piece: Piece) -> StoredRecords:
        """The records of ``piece`` as its spill file holds them, unchecked (see ``_reordered``)."""
        return StoredRecords.of_frames(piece, self._frames(piece))

    def records(self, piece: Piece) -> StoredRecords:
        """The records of ``piece``, read back from its spill file and checked (every length and CRC) before use."""
        frames = self._frames(piece)
        damage = _first_damaged(frames, piece.offsets)
        if damage is not None:
            record, check = damage
            raise spilling.damaged_spill(piece.ref.location, f"record {record} of the {len(piece)} read from byte "
                                         f"{piece.ref.offset} fails its {_CHECK_NAMES.get(check, check)}")
        return StoredRecords.of_frames(piece, frames)

    def _frames(self, piece: Piece) -> np.ndarray:
        data = spilling.read_spilled(piece.ref.location, piece.ref.offset, piece.num_bytes, "records")
        return np.frombuffer(data, dtype=np.uint8)


def _first_damaged(frames: np.ndarray, offsets: np.ndarray) -> tuple[int, str] | None:
    """``first_damaged_record`` a block of records at a time: the check works on a copy, which then stays a block."""
    framed = np.diff(offsets)
    for low, high in byte_blocks(framed, _CHECK_BLOCK_BYTES, len(framed) or 1):
        base = int(offsets[low])
        damage = first_damaged_record(frames[base:int(offsets[high])], offsets[low:high + 1] - base)
        if damage is not None:
            return low + damage[0], damage[1]
    return None


def _write_piece(piece: Piece, frames: np.ndarray, with_keys: bool) -> None:
    _write_file(piece.ref.location, frames)
    if with_keys:
        _write_keys(piece)


def _write_file(path: str, data: np.ndarray) -> None:
    spilling.write_spill_file(path, [memoryview(np.ascontiguousarray(data))])  # type: ignore[arg-type]  # an ndarray is a buffer; numpy types it so only for 3.12+


_KEYS_SUFFIX = ".keys"


def _write_keys(piece: Piece) -> None:
    """A spilled piece's keys, frame offsets, splits and footers, in a file beside its frames (``_read_keys`` reads them
    back; ``_KeysFile`` bisects them)."""
    if piece.footers is None:
        raise ValueError(f"{piece.ref.location}: a spilled piece's keys go to disk with its footers, and it has none")
    _write_file(piece.ref.location + _KEYS_SUFFIX, np.concatenate([
        piece.key.astype("<u8", copy=False).view(np.uint8), piece.offsets.astype("<i8", copy=False).view(np.uint8),
        piece.split.astype("<u2", copy=False).view(np.uint8), piece.footers.astype("<u4", copy=False).view(np.uint8),
    ]))


def _read_keys(ref: PieceRef, count: int, start: int, end: int) -> Piece:
    """Records ``start:end`` of the ``count`` of the spilled piece at ``ref``, from its keys' file, as ``Piece.slice``."""
    path = ref.location + _KEYS_SUFFIX
    with fs.open_read(path) as handle:
        key = _read_array(handle, path, "<u8", 8 * start, end - start)
        offsets = _read_array(handle, path, "<i8", 8 * count + 8 * start, end - start + 1)
        split = _read_array(handle, path, "<u2", 16 * count + 8 + 2 * start, end - start)
        footers = _read_array(handle, path, "<u4", 18 * count + 8 + 4 * start, end - start)
    first = int(offsets[0])
    narrowed = ref.narrowed(start, first, int(offsets[-1]))
    return Piece(split.astype(np.uint16), key.astype(np.uint64), (offsets - first).astype(np.int64), narrowed, footers)


class _KeysFile:
    """One column (keys or splits) of a spilled piece's keys file as a sequence read an item at a time: ``bisect``
    finds a key range in a few reads, without reading the file whole."""

    def __init__(self, handle: typing.BinaryIO, path: str, dtype: str, offset: int, count: int):
        self._handle, self._path, self._dtype, self._offset, self._count = handle, path, dtype, offset, count
        self._size = np.dtype(dtype).itemsize

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> int:
        return int(_read_array(self._handle, self._path, self._dtype, self._offset + index * self._size, 1)[0])


def _read_array(handle: typing.BinaryIO, path: str, dtype: str, offset: int, count: int) -> np.ndarray:
    handle.seek(offset)
    size = np.dtype(dtype).itemsize * count
    data = handle.read(size)
    if len(data) != size:
        raise ShuffledDataError(f"{path}: the keys of a spilled run end {size - len(data)} bytes early: the file was "
                                "changed on disk while the run used it. Nothing is published; run the build again")
    return np.frombuffer(data, dtype=dtype)


class _HeldPieces(spilling.Holding[str]):
    """The pieces one run holds in this process's memory, each dropped after its last shard slice is written.

    A held piece is its payloads where the encoder put them, with each record's start and masked
    CRC in (split, key) order: it was put in order by moving its keys only, never its bytes. The
    budget counts them by name (``Holding``); those being written into a spilled run are its ``spilling``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.buffers: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # payloads, starts, footers
        self.pending: dict[str, int] = {}  # per piece, shard slices not yet written
        self.released: dict[str, set[int]] = {}  # per piece, the shards whose slice was written
        self.shards_written: set[int] = set()
        # Every piece the run's store made (held or spilled), by location: it crosses the runner as its name.
        self.pieces: dict[str, Piece] = {}
        self.sorted: dict[str, Piece] = {}  # per held piece, its keys and frame offsets (for merging it into a run)
        # Per piece merged into a spilled run: the run for the first piece of each run, None for the others.
        self.merged: dict[str, Piece | None] = {}
        # Per spilled piece or run whose keys wait in a file beside it (not in memory): its record count.
        self.keys_on_disk: dict[str, int] = {}
        # Per piece or run whose copies got new keys (``MemoryStore.rekeyed``): what it became (a stub if on disk).
        self.rekeyed: dict[str, Piece] = {}
        self.rekeying = threading.Lock()  # one thread rekeys a piece; the others wait and take what it became

    def keys_to_disk(self, piece: Piece) -> Piece:
        """What stays in memory of a spilled piece or run: its keys go to a file beside it, unless it is not local.

        Held in memory they would cost 18 bytes a record until the shards are written (18 GB for a
        billion rows); the writers read them back when they route the piece and cut their slices.
        """
        if piece.ref.store != SPILL or not len(piece) or not fs.is_local(piece.ref.location):
            return piece
        _write_keys(piece)
        with self.lock:
            self.keys_on_disk[piece.ref.location] = len(piece)
        return _merged_stub(piece)

    def drop(self, name: str) -> None:
        del self.buffers[name]
        self.free(name)
        self.sorted.pop(name, None)
        self.pending.pop(name, None)
        self.released.pop(name, None)

    def discarded(self) -> None:
        for name in list(self.buffers):
            self.drop(name)


# The runs whose pieces are held in this process, by staging directory: an entry lives from the
# first piece a run holds until its last shard is written or ``discard_pieces`` ends the run.
_PIECES = spilling.HeldRuns("pieces", _HeldPieces)


class MemoryStore(PieceStore):
    """The payloads stay in this process's memory, up to ``budget`` bytes per run; beyond it pieces are spilled.

    Only for runs whose every worker runs in this process (the in-process local runners): the
    pieces carry no bytes, so the shard writers take them as a side input, without a routing
    stage and a GroupByKey. A piece is dropped once its last shard slice is written; the run's
    whole holding once its last shard is written, or by ``discard_pieces`` after a failure.

    Why a local build keeps this graph, not the GroupByKey graph Dataflow runs (``InlineStore``): on the 1M-row
    benchmark build (Parquet, shuffled, 8 shards, 2 cores) it takes 0.52x the wall time, 0.58x the
    CPU and 882 MiB against 1,344 MiB at peak, median of 5 paired runs, with byte-identical shards
    (docs/performance.md, "The house move, before and after").

    With ``merge_runs``, a piece that does not fit first sends every piece held so far to one spill
    file, merged in (split, key) order: a run as large as the budget. A shard writer then reads
    one part per run rather than one per piece, so its read windows (``SHARD_READ_BYTES`` shared
    by its parts) do not shrink as the dataset grows past the budget, and neither does the speed
    of reading them back. Ordered builds (no shuffle) number their buckets by row blocks of each
    piece, so they keep their pieces as they are.
    """

    name = MEMORY
    pieces_as_side_input = True
    tallies_whole_runs = True

    def __init__(self, run_key: str, budget: int, spill_directory: str, merge_runs: bool = True):
        self.run_key = run_key
        self.budget = budget
        self.overflow = SpillStore(spill_directory, keys_beside=False)
        self.merge_runs = merge_runs

    def _holding(self, create: bool = False) -> _HeldPieces | None:
        return _PIECES.open(self.run_key) if create else _PIECES.get(self.run_key)

    def _held(self, create: bool = False) -> _HeldPieces:
        return _PIECES.open(self.run_key) if create else _PIECES.require(self.run_key, "the pieces")

    def add(self, records: KeyedRecords) -> Piece:
        """Hold the piece's payloads as they are, ordered by moving its keys only; spill it past the budget.

        Either way the piece's keys stay in this process too, so the piece crosses the runner as its
        name (``PieceCoder``): its keys are not copied into the runner's buffers and side inputs.
        """
        held = self._held(create=True)
        piece = self._hold_within_budget(held, records)
        if piece is None and self.merge_runs and self._spill_held_run(held):
            piece = self._hold_within_budget(held, records)
        spilled = piece is None
        if piece is None:
            piece = self.overflow.add(records)
        piece = dataclasses.replace(piece, ref=dataclasses.replace(piece.ref, run=self.run_key))
        kept = held.keys_to_disk(piece) if spilled else piece
        with held.lock:
            merged = piece.ref.location in held.merged  # by another thread, before this one registered it
            held.pieces[piece.ref.location] = _merged_stub(piece) if merged else kept
        return piece

    def _hold_within_budget(self, held: _HeldPieces, records: KeyedRecords) -> Piece | None:
        """The piece held in memory if it fits the budget, else None."""
        with held.lock:
            fits = held.reserve(records.data.nbytes, self.budget)
        return self._hold(held, records) if fits else None

    def _spill_held_run(self, held: _HeldPieces) -> bool:
        """Write every piece held now (and not already being written) to one spill file as a merged run; free them.

        False when there was none to write (another thread took them, or nothing fits beside this piece).
        """
        def placed(names: list, run: Piece) -> None:
            for index, name in enumerate(names):
                held.merged[name] = run if index == 0 else None
                held.drop(name)
                if name in held.pieces:  # the run holds the keys now; the name only has to find it
                    held.pieces[name] = _merged_stub(held.pieces[name])

        return held.spill(lambda names: [(held.sorted[name], held.buffers[name]) for name in names],
                          lambda members: held.keys_to_disk(self._write_run(members)), placed)

    def _write_run(self, members: list[tuple[Piece, tuple[np.ndarray, np.ndarray, np.ndarray]]]) -> Piece:
        """Held pieces' records in one spill file in (split, key) order: the run, a spilled piece of them all."""
        run = [_RunMember(piece.split, piece.key, data, starts, piece.framed_lengths - RECORD_OVERHEAD, footers)
               for piece, (data, starts, footers) in members]
        path = spilling.spill_path(self.overflow.directory, ".bin")
        return dataclasses.replace(write_run(path, run), ref=PieceRef(SPILL, location=path, run=self.run_key))

    def runs_of(self, pieces: list[Piece]) -> list[Piece]:
        """Each piece, or the run it was merged into (once per run, where its first piece was)."""
        held = self._holding()
        if held is None:
            return pieces
        with held.lock:
            merged = dict(held.merged)
        resolved = []
        for piece in pieces:
            if piece.ref.location not in merged:
                resolved.append(piece)
            elif (run := merged[piece.ref.location]) is not None:
                resolved.append(run)
        return resolved

    def with_keys(self, piece: Piece) -> Piece:
        count = self._keys_on_disk(piece)
        return piece if count is None else _read_keys(piece.ref, count, 0, count)

    def slice_of(self, piece: Piece, start: int, end: int) -> Piece:
        count = self._keys_on_disk(piece)
        return piece.slice(start, end) if count is None else _read_keys(piece.ref, count, start, end)

    def _keys_on_disk(self, piece: Piece) -> int | None:
        """The record count of a piece or run whose keys wait on disk (its registry entry is a stub), else None."""
        held = self._holding()
        if held is None or len(piece):
            return None
        with held.lock:
            return held.keys_on_disk.get(piece.ref.location)

    def range_parts(self, piece: Piece, range_index: int, range_bits: int) -> list[tuple[int, Piece]]:
        """From memory, or from the keys file of a spilled run: bisected there, then only the range's records read."""
        count = self._keys_on_disk(piece)
        if count is None:
            return [(first, piece.slice(first, end))
                    for _, first, end in key_range_bounds(piece.split, piece.key, range_bits, range_index)]
        path = piece.ref.location + _KEYS_SUFFIX
        with fs.open_read(path) as handle:
            split, key = _KeysFile(handle, path, "<u2", 16 * count + 8, count), _KeysFile(handle, path, "<u8", 0, count)
            bounds = key_range_bounds(split, key, range_bits, range_index)
        return [(first, _read_keys(piece.ref, count, first, end)) for _, first, end in bounds]

    def rekeyed(self, piece: Piece, moved: typing.Mapping[str, typing.Iterable[MovedCopies]]) -> Piece:
        """Once per piece or run, whichever writer asks first (the others get what it became, without asking
        ``moved``: each question costs the local runners milliseconds).

        A held piece is put in its new order by moving its keys only; a spilled one is written again.
        """
        held = self._held()
        name = piece.ref.location
        with held.rekeying:
            done = held.rekeyed.get(name)
            if done is None:
                done = held.rekeyed[name] = super().rekeyed(piece, moved)
        return done

    def _reordered(self, piece: Piece, keys: np.ndarray) -> Piece:
        held = self._held()
        order = split_key_order(piece.split, keys)
        if piece.ref.store == MEMORY:
            lengths = piece.framed_lengths[order]
            offsets = np.zeros(len(order) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            with held.lock:
                payloads, starts, footers = held.buffers[piece.ref.location]
                footers = footers[order]
                held.buffers[piece.ref.location] = (payloads, starts[order], footers)
                reordered = Piece(piece.split[order], keys[order], offsets, piece.ref, footers)
                held.sorted[piece.ref.location] = held.pieces[piece.ref.location] = reordered
            return reordered
        stored = self.overflow.unchecked_records(piece)
        run = self._write_run([(dataclasses.replace(piece, key=keys), (stored.buffer, stored.starts, stored.footers))])
        stub = held.keys_to_disk(run)
        with held.lock:
            held.pieces[run.ref.location] = stub
        return stub

    @staticmethod
    def _hold(held: _HeldPieces, records: KeyedRecords) -> Piece:
        order = split_key_order(records.split, records.key)
        crcs = records.crcs if records.crcs is not None else payload_crcs(records.data, records.offsets)
        frame_offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(records.lengths[order] + RECORD_OVERHEAD, out=frame_offsets[1:])
        name = uuid.uuid4().hex
        footers = mask_crcs(crcs[order]).astype("<u4")
        piece = Piece(records.split[order], records.key[order], frame_offsets, PieceRef(MEMORY, location=name), footers)
        with held.lock:
            held.buffers[name] = (records.data, records.offsets[:-1][order], footers)
            held.keep(name, records.data.nbytes)
            held.sorted[name] = piece
            held.pending[name] = 0
        return piece

    def flush(self) -> None:
        self.overflow.flush()

    def close(self) -> None:
        self.overflow.close()

    def records(self, piece: Piece) -> StoredRecords:
        if piece.ref.store == SPILL:
            return self.overflow.records(piece)
        if piece.ref.store != MEMORY:
            return StoredRecords.of_frames(piece, piece.ref.frames())  # an inline piece (an empty shard's)
        held = self._held().buffers.get(piece.ref.location)
        if held is None:
            raise RuntimeError(f"piece {piece.ref.location} of the run staging in {self.run_key} was already dropped")
        payloads, starts, footers = held
        first, count = piece.ref.offset, len(piece)
        return StoredRecords(payloads, starts[first:first + count], piece.framed_lengths - RECORD_OVERHEAD,
                             footers[first:first + count])

    def read_in_windows(self, piece: Piece) -> bool:
        return piece.ref.store == SPILL

    def routed(self, piece: Piece, slices: int) -> None:
        if piece.ref.store != MEMORY:
            return
        held = self._holding()
        if held is None:
            return  # the run ended; reading the piece's frames says so
        with held.lock:
            name = piece.ref.location
            if name in held.buffers and name not in held.released:
                held.released[name] = set()
                held.pending[name] += slices

    def written(self, piece: Piece, shard_key: int) -> None:
        """Drop the piece after its last slice was written (a retried shard counts once)."""
        held = self._holding() if piece.ref.store == MEMORY else None
        if held is None:
            return
        with held.lock:
            name = piece.ref.location
            released = held.released.get(name)
            if released is not None and shard_key not in released:
                released.add(shard_key)
                held.pending[name] -= 1
                if held.pending[name] <= 0:
                    held.drop(name)

    def shard_written(self, shard_key: int, num_shards: int) -> None:
        """After the run's last shard (of ``num_shards``) the run holds nothing: its entry goes."""
        held = self._holding()
        if held is None:
            return
        with held.lock:
            held.shards_written.add(shard_key)
            finished = len(held.shards_written) >= num_shards
        if finished:
            discard_pieces(self.run_key)


def _merged_stub(piece: Piece) -> Piece:
    """What a piece merged into a run stays in the registry as: its name (``runs_of`` finds the run by it), no keys."""
    return Piece(np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(1, np.int64), piece.ref)


def discard_pieces(run_key: str) -> None:
    """Free every piece the run staging in ``run_key`` holds in this process's memory (its end, or after a failure)."""
    _PIECES.end(run_key)


def runs_holding_pieces() -> list[str]:
    """The runs that hold pieces in this process's memory now (none once every build has ended)."""
    return _PIECES.runs()


def registered_piece(run_key: str, location: str) -> Piece:
    """The piece a memory store of run ``run_key`` made at ``location``, as it is in this process's memory."""
    held = _PIECES.get(run_key)
    piece = held.pieces.get(location) if held is not None else None
    if piece is None:
        raise spilling.missing(run_key, f"piece {location}", "the run ended")
    return piece


def is_registered(piece: Piece) -> bool:
    """Whether ``piece`` can cross the runner as its name: the registry holds it, or its keys are in a file beside it."""
    held = _PIECES.get(piece.ref.run)
    if held is None:
        return False
    with held.lock:
        entry = held.pieces.get(piece.ref.location)
        return entry is piece or (entry is not None and piece.ref.location in held.keys_on_disk)


def make_piece_store(name: str, temp_dir: str, budget: int = 0, merge_runs: bool = False) -> PieceStore:
    """The store ``name`` (one of PIECE_STORES) for the run staging in ``temp_dir``; ``budget`` bounds a memory store.

    With ``merge_runs`` (not for ordered builds: see MemoryStore) a memory store spills runs as large as its budget,
    and a spill store's workers gather SPILL_RUN_BYTES of pieces into each run.
    """
    spill_dir = fs.join(temp_dir, SPILL_DIR_NAME)
    if name == INLINE:
        return InlineStore()
    if name == SPILL:
        return SpillStore(spill_dir, SPILL_RUN_BYTES if merge_runs else 0)
    if name == MEMORY:
        return MemoryStore(temp_dir, budget, spill_dir, merge_runs)
    raise ValueError(f"unknown piece store {name!r}; choose one of {', '.join(PIECE_STORES)}")
