"""The reading path's costs that once bounded an epoch (issue 41 item 6), and the shuffle pool they touch.

A raw epoch of the object-store benchmark (300,000 records of ~400 bytes) spent its time on an
index array per byte in the shuffle pool, a Python slice per record to join a block's payloads,
and read buffers zero-filled holding the GIL. Each test here pins one of those away; the pool's
property test pins that it still hands out exactly the rows, in exactly the order, of the rule
it always followed.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

import tfrbeam.dataset.columns as columns_module
import tfrbeam.tfrecord.blocks as blocks_module
from tfrbeam.codec.example import encode_example
from tfrbeam.dataset import open_dataset
from tfrbeam.dataset.columns import Column, ShufflePool, take_block
from tfrbeam.dataset.reader import _list_lengths, numpy_of
from tfrbeam.errors import RecordError
from tfrbeam.tfrecord.blocks import record_blocks
from tfrbeam.tfrecord.records import RecordWriter

# ---------------------------------------------------------------- rows as Python values, and back


def _column(rows: list, depth: int, leaf: str) -> Column:
    """Rows (nested lists ``depth - 1`` deep, ending in bytes or ints) as a Column."""
    if depth == 0:
        return Column(np.asarray(rows, dtype=np.int64).reshape(len(rows), -1))
    levels = []
    values = rows
    for _ in range(depth - (1 if leaf == "bytes" else 0)):
        levels.append(np.array([len(value) for value in values], dtype=np.int64))
        values = [item for value in values for item in value]
    if leaf == "bytes":
        levels.append(np.array([len(value) for value in values], dtype=np.int64))
        return Column(np.frombuffer(b"".join(values), dtype=np.uint8).copy(), tuple(levels))
    return Column(np.asarray(values, dtype=np.int64), tuple(levels))


def _rows(column: Column, leaf: str) -> list:
    """The inverse of ``_column``."""
    if not column.levels:
        return column.leaf.tolist()
    values: list = bytes(column.leaf) if leaf == "bytes" else column.leaf.tolist()
    for lengths in reversed(column.levels):
        ends = np.cumsum(lengths).tolist()
        values = [values[end - length:end] for end, length in zip(ends, lengths.tolist())]
    return values


_KINDS = {  # name: (depth, leaf)
    "dense": (0, "int"),
    "record": (1, "bytes"),
    "tags": (2, "bytes"),
    "counts": (1, "int"),
    "steps": (3, "bytes"),
}


def _row(draw: st.DrawFn, depth: int, leaf: str) -> object:
    if depth == 0:
        return draw(st.lists(st.integers(-9, 9), min_size=2, max_size=2))
    if depth == 1:
        return draw(st.binary(max_size=40)) if leaf == "bytes" else draw(st.lists(st.integers(-9, 9), max_size=5))
    return [_row(draw, depth - 1, leaf) for _ in range(draw(st.integers(0, 3)))]


@st.composite
def _operations(draw: st.DrawFn) -> list[tuple[str, object]]:
    """Blocks of rows added and batches popped, in some order."""
    operations: list[tuple[str, object]] = []
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            rows = draw(st.integers(0, 30))
            operations.append(("add", [{name: _row(draw, *kind) for name, kind in _KINDS.items()} for _ in range(rows)]))
        else:
            operations.append(("pop", draw(st.integers(1, 25))))
    return operations


class _ReferencePool:
    """The shuffle pool's rule on Python rows: draw uniformly without replacement, then fill holes from the top."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.rows: list[dict] = []

    def pop(self, count: int) -> list[dict]:
        size = len(self.rows)
        count = min(count, size)
        picked = (self.rng.choice(size, size=count, replace=False) if count < size else self.rng.permutation(size)).tolist()
        out = [self.rows[index] for index in picked]
        end = size - count
        taken = set(picked)
        holes = [index for index in picked if index < end]
        movers = [index for index in range(end, size) if index not in taken]
        for hole, mover in zip(holes, movers):
            self.rows[hole] = self.rows[mover]
        del self.rows[end:]
        return out


@settings(max_examples=60)
@given(_operations(), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_the_pool_gives_the_rows_of_its_rule_in_its_order(operations, capacity, seed):
    """Fixed, byte, nested and numeric columns come out of the pool (and ``take``) exactly as the rule draws them."""
    pool, reference = ShufflePool(capacity, np.random.default_rng(seed)), _ReferencePool(np.random.default_rng(seed))
    for kind, argument in operations:
        if kind == "add":
            rows = argument
            if not rows:
                continue
            block = {name: _column([row[name] for row in rows], *_KINDS[name]) for name in _KINDS}
            order = np.random.default_rng(seed).permutation(len(rows))
            taken = take_block(block, order)
            for name, (_, leaf) in _KINDS.items():
                assert _rows(taken[name], leaf) == [rows[index][name] for index in order.tolist()]
            pool.add(block)
            reference.rows.extend(rows)
        elif pool.size:
            drawn = pool.pop(argument)
            expected = reference.pop(argument)
            for name, (_, leaf) in _KINDS.items():
                assert _rows(drawn[name], leaf) == [row[name] for row in expected], name
        assert pool.size == len(reference.rows)


# ------------------------------------------------------------------- what an epoch may not cost


def _raw_dataset(tmp_path, records: int = 3000, size: int = 400) -> tuple[str, int]:
    rng = np.random.default_rng(0)
    path = tmp_path / "raw.tfrecord"
    with RecordWriter(str(path)) as writer:
        for _ in range(records):
            writer.write(rng.integers(0, 256, int(rng.integers(size // 2, size)), dtype=np.uint8).tobytes())
    return str(path), records


def test_the_shuffle_pool_gathers_record_bytes_without_an_index_per_byte(tmp_path, monkeypatch):
    """A raw epoch through a shuffle buffer builds index arrays per record, not per byte.

    An int64 index per byte (8 bytes of index to move one) was the pool's cost: a third of a
    raw epoch of the benchmark's 400-byte records.
    """
    path, records = _raw_dataset(tmp_path)
    indexed = [0]
    ranges = columns_module.ranges

    def counting(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        out = ranges(starts, lengths)
        indexed[0] += len(out)
        return out

    monkeypatch.setattr(columns_module, "ranges", counting)
    seen = []
    with open_dataset(path, raw=True, batch_size=100, shuffle_buffer=500, seed=1, executor="threads") as dataset:
        for batch in dataset:
            seen.extend(batch["record"].tolist())
    assert len(seen) == records and len(set(seen)) == records
    assert indexed[0] <= 4 * records  # the old pool: ~300 per record (one per byte), ~900,000 here


def test_raw_records_are_made_once_and_moved_by_reference(tmp_path, monkeypatch):
    """A raw record's bytes object is made once, when its block is read: the shuffle buffer and the batches move it.

    Raw records went into the pool's byte arena (a copy), out of it by a gather (a copy), then into the
    caller's ``bytes`` (a copy); the three were half the CPU of the benchmark's raw epoch.
    """
    import tfrbeam.dataset.output as output_module

    path, _ = _raw_dataset(tmp_path)
    gathered: list[int] = []
    gather = columns_module.gather_values

    def counting(leaf, offsets, index):
        gathered.append(len(index))
        return gather(leaf, offsets, index)

    made_later: list[int] = []
    binary = output_module._binary_array

    def counting_binary(leaf, lengths):
        made_later.append(len(leaf))
        return binary(leaf, lengths)

    monkeypatch.setattr(columns_module, "gather_values", counting)
    monkeypatch.setattr(output_module, "_binary_array", counting_binary)
    expected = [block.payload(index) for block in record_blocks(path, None, 0, 1 << 20) for index in range(block.num_records)]
    for shuffle_buffer, output in ((500, "numpy"), (0, "numpy"), (500, "arrow")):
        with open_dataset(path, raw=True, batch_size=100, shuffle_buffer=shuffle_buffer, seed=1, executor="threads",
                          output=output) as dataset:
            batches = [batch["record"] if output == "numpy" else batch.column("record").to_pylist() for batch in dataset]
        seen = [value for batch in batches for value in batch]
        assert sorted(seen) == sorted(expected) and (shuffle_buffer or seen == expected)
        if output == "numpy":
            assert all(batch.dtype == object for batch in batches)
            assert not made_later
    assert not gathered


def test_the_shuffle_pool_compacts_into_the_arenas_it_has():
    """Compacting the pool's arenas reuses them: fresh arrays at every compaction cost a page fault per 4 KiB
    written (some 230 MB of new pages a raw epoch of the object-store benchmark), and the rows stay the rule's."""
    rng = np.random.default_rng(3)
    pool, reference = ShufflePool(2000, np.random.default_rng(8)), _ReferencePool(np.random.default_rng(8))
    added = 0
    arenas: list[np.ndarray] = []  # kept alive, so no two arrays share an id
    for _ in range(40):
        rows = [{"record": rng.bytes(int(rng.integers(100, 700)))} for _ in range(1500)]
        added += sum(len(row["record"]) for row in rows)
        pool.add({"record": _column([row["record"] for row in rows], 1, "bytes")})
        reference.rows.extend(rows)
        arena = pool._columns["record"].leaf
        if not any(arena is seen for seen in arenas):
            arenas.append(arena)
        while pool.size >= 2000:
            assert _rows(pool.pop(256)["record"], "bytes") == [row["record"] for row in reference.pop(256)]
    # Between compactions an arena only appends: bytes added k times its size took at least k compactions.
    assert added >= 5 * max(len(arena) for arena in arenas)
    assert len(arenas) <= 3, f"{len(arenas)} arenas allocated for {added} bytes added"


def _framed(payloads: list[bytes]) -> tuple[bytes, np.ndarray]:
    """A TFRecord file's bytes and its offset index's starts (every record start, then the size)."""
    stream = io.BytesIO()
    with RecordWriter(stream) as writer:
        writer.write_many(payloads)
    lengths = np.array([len(payload) + 16 for payload in payloads], dtype=np.int64)
    return stream.getvalue(), np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)


def _blocks_or_error(data: bytes, **options: object) -> list[tuple] | tuple[str, str]:
    try:
        return [(bytes(block.joined()[0]), block.starts.tolist(), block.ends.tolist(), block.offsets.tolist())
                if block.data is not None else (block.lengths.tolist(), block.offsets.tolist())
                for block in record_blocks(io.BytesIO(data), None, **options)]  # type: ignore[arg-type]
    except RecordError as error:
        return type(error).__name__, str(error)


_HINTS = ["exact", "shifted", "one record short", "another file's", "a bad length"]


@settings(max_examples=80)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=60), st.integers(1, 25), st.sampled_from(_HINTS),
       st.integers(0, 59), st.integers(0, 60), st.sampled_from([None, "crc", "cut"]), st.booleans())
def test_record_starts_from_an_index_change_nothing_that_is_read(sizes, block_length, hint, first, count, damage, verify):
    """``record_blocks(record_starts=...)`` gives the blocks (or the error) of the walk over the headers, whatever the
    starts say: exact, wrong in any way, for a damaged file; from any record, for any limit."""
    rng = np.random.default_rng(len(sizes) * 7 + block_length)
    data, starts = _framed([rng.bytes(size) for size in sizes])
    start = int(starts[min(first, len(sizes) - 1)])
    if damage == "crc":
        data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1:]
    elif damage == "cut":
        data = data[:len(data) - 5]
    if hint == "shifted":
        starts = starts + 1
    elif hint == "one record short":
        starts = np.delete(starts, len(starts) // 2)
    elif hint == "another file's":
        starts = _framed([rng.bytes(size) for size in sorted(sizes)])[1]
    elif hint == "a bad length":
        starts = starts.copy()
        starts[len(starts) // 2] += 3
    options = {"start_offset": start, "block_length": block_length, "limit": count or None, "verify": verify}
    assert _blocks_or_error(data, record_starts=starts, **options) == _blocks_or_error(data, **options)


def test_a_dataset_read_checks_its_offset_index_instead_of_walking_the_headers(tmp_path):
    """With its shards' offset indexes, an epoch walks no record header in Python (a fifth of a raw epoch's CPU on the
    object-store benchmark's shards): each block's starts come from the index, checked at once against the headers."""
    import tfrbeam

    table = pa.table({"id": np.arange(30_000, dtype=np.int64), "name": [f"row {i}" for i in range(30_000)]})
    tfrbeam.write_dataset(table, str(tmp_path / "ds"), splits={"train": 1.0}, num_shards=2, progress=False)
    options = {"split": "train", "batch_size": 1000, "shuffle_buffer": 5000, "seed": 4, "executor": "threads"}
    with open_dataset(str(tmp_path / "ds"), raw=True, **options) as dataset:
        expected = [batch["record"].tolist() for batch in dataset]
    walked = blocks_module.records_walked()
    with open_dataset(str(tmp_path / "ds"), raw=True, **options) as dataset:
        assert [batch["record"].tolist() for batch in dataset] == expected
    assert blocks_module.records_walked() == walked
    for index in (tmp_path / "ds" / "train" / ".tfrbeam-index").glob("*.index"):
        index.unlink()
    with open_dataset(str(tmp_path / "ds"), raw=True, **options) as dataset:
        assert [batch["record"].tolist() for batch in dataset] == expected
    assert blocks_module.records_walked() >= walked + 30_000  # every record's header


def _fastest(function, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def test_joining_a_blocks_payloads_costs_about_a_copy(tmp_path):
    """A raw block's payloads are joined by one vectorised copy, not a Python slice per record (7x slower)."""
    path, _ = _raw_dataset(tmp_path, records=8192)
    (block,) = record_blocks(path, None, 0, 8192)
    joined, bounds = block.joined()
    assert bytes(joined) == b"".join(block.payload(index) for index in range(block.num_records))
    assert bounds[-1] == len(joined)
    data = np.asarray(block.data)
    copy = _fastest(lambda: data.copy())
    join = _fastest(block.joined)
    assert join < 6 * copy + 3e-4, f"joining took {join * 1e3:.2f} ms, a copy of the block {copy * 1e3:.2f} ms"


def test_read_buffers_are_not_zero_filled(tmp_path, monkeypatch):
    """The read window takes memory without filling it: ``bytearray(n)`` zero-fills holding the GIL.

    On threads that fill was a quarter of the GIL-holding samples of a raw epoch (the page
    faults of a fresh buffer per file, paid where no other thread can run).
    """
    path, records = _raw_dataset(tmp_path)
    made: list[int] = []

    def counting_bytearray(*args: object) -> bytearray:
        out = bytearray(*args)  # type: ignore[call-overload]
        made.append(len(out))
        return out

    monkeypatch.setattr(blocks_module, "bytearray", counting_bytearray, raising=False)
    read: list[int] = []
    # A fresh thread: no read buffer left over from an earlier read on this one
    reader = threading.Thread(target=lambda: read.append(sum(block.num_records for block in record_blocks(path, None, 0, 1000))))
    reader.start()
    reader.join()
    assert read == [records]
    assert not [size for size in made if size > 1 << 16]


def test_auto_reads_raw_records_on_threads(tmp_path, monkeypatch):
    """``executor="auto"`` starts processes only to decode: raw records on processes cost their start-up and a pipe.

    The object-store benchmark's raw epoch took 3.2 s on processes, 1.0 s on threads.
    """
    import tfrbeam.dataset.pipeline as pipeline_module

    path = tmp_path / "examples.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write_many([encode_example({"x": [index]}) for index in range(200)])
    monkeypatch.setattr(pipeline_module, "AUTO_PROCESSES_BYTES", 0)  # every dataset counts as large
    with open_dataset(str(path), raw=True, num_workers=2, batch_size=64) as dataset:
        assert sum(len(batch["record"]) for batch in dataset) == 200
        assert dataset.stats["executor"] == "threads"
    with open_dataset(str(path), num_workers=2, batch_size=64) as dataset:
        assert sorted(value for batch in dataset for value in batch["x"].tolist()) == list(range(200))
        assert dataset.stats["executor"] == "processes"


@given(st.lists(st.one_of(st.none(), st.lists(st.integers(-2**40, 2**40), max_size=4)), max_size=30),
       st.integers(0, 30), st.integers(0, 30), st.sampled_from(["int64", "int32", "float32", "float64", "uint8"]))
def test_numpy_of_gives_what_arrow_gives(rows, start, length, kind):
    """Numbers, booleans and list lengths read from an array's buffers are Arrow's own, sliced arrays too."""
    lists = pa.array(rows, pa.list_(pa.int64())).slice(start, length)
    values = lists.flatten().cast(pa.type_for_alias(kind), safe=False)
    assert numpy_of(values).tolist() == values.to_numpy(zero_copy_only=False).tolist()
    assert numpy_of(values).dtype == values.to_numpy(zero_copy_only=False).dtype
    validity = lists.is_valid()
    assert numpy_of(validity).tolist() == validity.to_pylist()
    assert numpy_of(validity.slice(min(start, len(validity)))).tolist() == validity.slice(min(start, len(validity))).to_pylist()
    assert _list_lengths(lists).tolist() == [len(row or []) for row in rows[start:start + length]]


def test_reader_processes_import_no_pandas(tmp_path):
    """A reader process's work (``produce``: read, check, decode) imports no pandas; Arrow's ``to_numpy`` and
    ``fill_null`` did: 0.4 s in each process, each time a dataset opens, on its first block."""
    path = tmp_path / "examples.tfrecord"
    with RecordWriter(str(path)) as writer:
        writer.write_many([encode_example({"x": [index], "tags": [b"t"] * (index % 3), "v": [1.5] * (index % 2) or None},
                                          kinds={"tags": "bytes", "v": "float"}) for index in range(50)])
    program = f"""
import sys
from tfrbeam.dataset.reader import BlockDecoder, Segment
from tfrbeam.dataset.spec import FixedLenFeature, VarLenFeature
from tfrbeam.dataset.workers import Job, ReadPlan, SlotStart, produce
features = {{"x": FixedLenFeature((), "int64"), "tags": VarLenFeature("bytes"), "v": VarLenFeature("float")}}
plan = ReadPlan((Segment({str(path)!r}, None),), BlockDecoder(features), 16, False)
blocks = [message for _, message in produce(plan, Job((SlotStart(0, (0,)),), True)) if message != "end"]
assert sum(len(block.ids) for block in blocks) == 50
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
