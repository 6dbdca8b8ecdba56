"""The seeded shuffle, hash splits and exactly balanced shards, with each piece store (tfrbeam/builder/shuffle/)."""

from __future__ import annotations

import collections
import operator
import os
import pathlib
import random

import apache_beam as beam
import crc32c
import numpy as np
import pytest
import xxhash
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import given, settings, strategies as st

from tfrbeam.builder.shuffle import (
    INLINE,
    MEMORY,
    PIECE_STORES,
    SPILL,
    BucketCounts,
    KeyedRecords,
    KeyedRecordsCoder,
    MemoryStore,
    Piece,
    PieceCoder,
    PieceRef,
    ShardingSpec,
    WriteShuffledShards,
    bucket_bits_for,
    content_digests,
    discard_pieces,
    input_order_keys,
    make_piece_store,
    make_plan,
    occurrence_keys,
    received as received_module,
    record_checksums,
    runs_holding_pieces,
    seeded_sort_keys,
    split_indices,
)
from tfrbeam.layout.names import shard_file_name
from tfrbeam.tfrecord.read_index import index_path_for, parse_read_index
from tfrbeam.tfrecord.records import RECORD_OVERHEAD, frame_records, read_records


def _pieces(
    payloads: list[bytes], piece_sizes: list[int], fractions, seed: int | None, with_crcs: bool = False
) -> list[KeyedRecords]:
    """Cut payloads into pieces and key them as the build does (content digest and CRCs, split, seeded key)."""
    pieces, start, row = [], 0, 0
    for size in piece_sizes:
        chunk = payloads[start:start + size]
        start += size
        if not chunk:
            continue
        data = np.frombuffer(b"".join(chunk), dtype=np.uint8)
        offsets = np.zeros(len(chunk) + 1, np.int64)
        np.cumsum([len(item) for item in chunk], out=offsets[1:])
        digests, crcs = record_checksums(data, offsets)
        split = split_indices(digests[:, 0], fractions)
        if seed is None:
            key = input_order_keys(0, np.arange(row, row + len(chunk)))
        else:
            key = seeded_sort_keys(digests[:, 1], seed)
        row += len(chunk)
        pieces.append(KeyedRecords(split, key, offsets, data, crcs=crcs if with_crcs else None))
    return pieces


def _prepared(records: KeyedRecords) -> Piece:
    """An inline piece as the shuffle prepares it: frames sorted by (split, key)."""
    split, key, offsets, frames = records.sorted_frames()
    return Piece(split, key, offsets, PieceRef(INLINE, data=frames))


def _run(
    pieces: list[KeyedRecords], spec: ShardingSpec, temp_dir: pathlib.Path, store: str = INLINE, budget: int = 1 << 30
) -> None:
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as pipeline:
        _ = (
            pipeline
            | beam.Create(pieces).with_output_types(KeyedRecords)
            | WriteShuffledShards(spec, str(temp_dir), make_piece_store(store, str(temp_dir), budget))
        )
    assert runs_holding_pieces() == []  # a memory store's holding ends with its run


def _read_split(temp_dir: pathlib.Path, split: str) -> list[list[bytes]]:
    files = sorted((temp_dir / split).glob(f"{split}-*"))
    return [list(read_records(str(path))) for path in files]


def _dataset(count: int, rng: random.Random) -> list[bytes]:
    payloads = [rng.randbytes(rng.randint(0, 40)) for _ in range(count)]
    payloads += payloads[:25]  # duplicates are kept
    rng.shuffle(payloads)
    return payloads


def _spec(**overrides) -> ShardingSpec:
    values = {"splits": ("train", "eval"), "num_shards": (3, 2), "max_bytes_per_shard": None, "ordered": False}
    values.update(overrides)
    return ShardingSpec(**values)


def test_split_fractions_are_honoured_within_sampling_error():
    hashes = np.random.default_rng(1).integers(0, 2**64, 200_000, dtype=np.uint64, endpoint=False)
    counts = np.bincount(split_indices(hashes, [0.7, 0.2, 0.1]), minlength=3) / len(hashes)
    np.testing.assert_allclose(counts, [0.7, 0.2, 0.1], atol=0.005)
    assert split_indices(np.array([0, 2**64 - 1], np.uint64), [0.5, 0.5]).tolist() == [0, 1]


def test_seeded_keys_are_a_bijection_that_changes_with_the_seed():
    hashes = np.arange(100_000, dtype=np.uint64)
    keys = seeded_sort_keys(hashes, 42)
    assert len(np.unique(keys)) == len(hashes)
    np.testing.assert_array_equal(keys, seeded_sort_keys(hashes, 42))
    order_a, order_b = np.argsort(keys), np.argsort(seeded_sort_keys(hashes, 43))
    assert abs(np.corrcoef(order_a, order_b)[0, 1]) < 0.02
    assert abs(np.corrcoef(order_a, hashes.astype(np.float64))[0, 1]) < 0.02


def test_content_digest_is_xxh3_128_of_each_record():
    records = [b"", b"a", b"hello world" * 10, bytes(range(256)) * 3]
    offsets = np.cumsum([0] + [len(item) for item in records])
    digests = content_digests(b"".join(records), offsets)
    # The reference vector of the xxHash specification: XXH3-128 of the empty input, seed 0.
    assert digests[0].astype("<u8").tobytes().hex() == "99aa06d3014798d86001c324468d497f"
    for record, digest in zip(records, digests):
        assert digest.astype("<u8").tobytes() == xxhash.xxh3_128_digest(record)
    both, crcs = record_checksums(np.frombuffer(b"".join(records), np.uint8), offsets)
    np.testing.assert_array_equal(both, digests)
    assert crcs.dtype == np.uint32 and crcs.tolist() == [crc32c.crc32c(record) for record in records]


def test_input_order_keys_sort_by_file_then_row():
    keys = np.concatenate([input_order_keys(1, np.array([0, 5])), input_order_keys(0, np.array([7, 2**39]))])
    assert np.argsort(keys).tolist() == [2, 3, 0, 1]
    with pytest.raises(ValueError, match="row numbers"):
        input_order_keys(0, np.array([2**41]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=20))
def test_keyed_records_and_piece_coders_round_trip(payloads):
    offsets = np.cumsum([0] + [len(item) for item in payloads]).astype(np.int64)
    records = KeyedRecords(
        np.arange(len(payloads), dtype=np.uint16), np.arange(len(payloads), dtype=np.uint64) * 7, offsets,
        np.frombuffer(b"".join(payloads), dtype=np.uint8),
    )
    coder = KeyedRecordsCoder()
    with_crcs = KeyedRecords(
        records.split, records.key, records.offsets, records.data, crcs=np.arange(len(payloads), dtype=np.uint32) * 3
    )
    for value in (records, with_crcs):
        decoded = coder.decode(coder.encode(value))
        for field in ("split", "key", "offsets", "data"):
            np.testing.assert_array_equal(getattr(decoded, field), getattr(value, field))
        assert (decoded.crcs is None) == (value.crcs is None)
        # Beam samples element sizes; the estimate is computed, and exact.
        assert coder.estimate_size(value) == len(coder.encode(value))
    split, key, frame_offsets, frames = records.sorted_frames()
    assert frames.tobytes() == frame_records([payloads[int(i)] for i in np.lexsort((records.key, records.split))])
    pieces = [
        Piece(split, key, frame_offsets, PieceRef(INLINE, data=frames)),
        Piece(split, key, frame_offsets, PieceRef(SPILL, location="gs://b/é.bin", offset=7)),
        Piece(split, key, frame_offsets, PieceRef(MEMORY, location="0123abcd")),
    ]
    half = len(payloads) // 2
    piece_coder = PieceCoder()
    for piece in pieces + [piece.slice(half, len(payloads)) for piece in pieces]:
        decoded = piece_coder.decode(piece_coder.encode(piece))
        for field in ("split", "key", "offsets"):
            np.testing.assert_array_equal(getattr(decoded, field), getattr(piece, field))
        assert (decoded.ref.store, decoded.ref.location, decoded.ref.offset) == (
            piece.ref.store,
            piece.ref.location,
            piece.ref.offset,
        )
        assert (decoded.ref.data is None) == (piece.ref.data is None)
        if piece.ref.data is not None:
            assert decoded.ref.data.tobytes() == piece.ref.data.tobytes()
        assert piece_coder.estimate_size(piece) == len(piece_coder.encode(piece))
    # A slice narrows the reference: the frames of records half.. start where record half's frame starts.
    assert pieces[1].slice(half, len(payloads)).ref.offset == 7 + int(frame_offsets[half])
    assert pieces[0].slice(half, len(payloads)).ref.data.tobytes() == frames[int(frame_offsets[half]):].tobytes()
    assert pieces[2].slice(half, len(payloads)).ref.offset == half  # a held piece is addressed by record


def test_shard_names_and_bucket_bits():
    assert shard_file_name("train", 3, 8, None) == "train-00003-of-00008.tfrecord"
    assert shard_file_name("eval", 0, 123456, "gzip") == "eval-000000-of-123456.tfrecord.gz"
    assert bucket_bits_for(8) == 10 and bucket_bits_for(1 << 20) == 24


def test_byte_cap_plan_keeps_every_shard_under_the_cap():
    rng = random.Random(3)
    payloads = [rng.randbytes(rng.choice([10, 10, 10, 900])) for _ in range(3000)]
    spec = _spec(splits=("train",), num_shards=(None,), max_bytes_per_shard=20_000)
    combine = BucketCounts(spec)
    accumulator = combine.create_accumulator()
    for piece in _pieces(payloads, [700] * 5, [1.0], seed=5):
        accumulator = combine.add_input(accumulator, _prepared(piece))
    plan = make_plan(combine.extract_output(accumulator), spec).splits[0]
    total = sum(len(item) + RECORD_OVERHEAD for item in payloads)
    assert plan.num_examples == 3000 and plan.num_bytes == total
    assert plan.num_shards >= -(-total // 20_000)
    # Each shard's exact bytes: sort by the seeded key as the writers do.
    pieces = _pieces(payloads, [3000], [1.0], seed=5)
    order = np.argsort(pieces[0].key, kind="stable")
    sizes = np.diff(pieces[0].offsets)[order] + RECORD_OVERHEAD
    for shard in range(plan.num_shards):
        assert sizes[plan.shard_start(shard):plan.shard_start(shard + 1)].sum() <= 20_000


def test_byte_cap_smaller_than_a_record_is_refused():
    spec = _spec(splits=("train",), num_shards=(None,), max_bytes_per_shard=50)
    combine = BucketCounts(spec)
    accumulator = combine.add_input(combine.create_accumulator(), _prepared(_pieces([b"x" * 100], [1], [1.0], seed=0)[0]))
    with pytest.raises(ValueError, match=r"larger than output\.max_bytes_per_shard=50"):
        make_plan(combine.extract_output(accumulator), spec)


def test_shuffled_shards_are_exactly_balanced_complete_and_sorted(tmp_path):
    payloads = _dataset(1500, random.Random(7))
    fractions = [0.8, 0.2]
    spec = _spec(bucket_bits=10)
    _run(_pieces(payloads, [400, 1, 600, 525], fractions, seed=11), spec, tmp_path / "a")
    written = {split: _read_split(tmp_path / "a", split) for split in ("train", "eval")}
    assert [len(written["train"]), len(written["eval"])] == [3, 2]
    for shards in written.values():
        sizes = [len(shard) for shard in shards]
        assert max(sizes) - min(sizes) <= 1
    everything = [record for shards in written.values() for shard in shards for record in shard]
    assert collections.Counter(everything) == collections.Counter(payloads)
    # The whole split, read shard after shard, is in (seeded key, bytes) order, copy k of a record keyed
    # occurrence_keys(key, k).
    expected = _expected_order(payloads, fractions, 11)
    for index, split in enumerate(("train", "eval")):
        records = [record for shard in written[split] for record in shard]
        assert records == expected[index] and all(s == index for _, _, s in _keys_of(records, fractions, 11))
    # Uncompressed shards get a read index next to them.
    first = sorted((tmp_path / "a" / "train").glob("train-*"))[0]
    index = parse_read_index(pathlib.Path(index_path_for(str(first))).read_bytes(), "index")
    assert index.num_records == len(written["train"][0]) and index.mtime is None


def _keys_of(records, fractions, seed):
    offsets = np.cumsum([0] + [len(item) for item in records]).astype(np.int64)
    digests = content_digests(b"".join(records), offsets)
    return list(zip(records, seeded_sort_keys(digests[:, 1], seed), split_indices(digests[:, 0], fractions)))


def _in_final_order(keyed: list[tuple[int, int, bytes]]) -> dict[int, list[bytes]]:
    """(split, key, record) of every record, copies included, to each split's records in the shuffle's order: copy k
    of a record keyed ``occurrence_keys(key, k)``, then by frame bytes."""
    copies = collections.Counter(keyed)
    final = collections.defaultdict(list)
    for (split, key, record), count in copies.items():
        keys = occurrence_keys(np.full(count, key, np.uint64), np.arange(count, dtype=np.uint64))
        final[split].extend((int(copy_key), frame_records([record]), record) for copy_key in keys)
    return {split: [record for _, _, record in sorted(items)] for split, items in final.items()}


def _expected_order(payloads: list[bytes], fractions, seed) -> dict[int, list[bytes]]:
    return _in_final_order([(int(split), int(key), record) for record, key, split in _keys_of(payloads, fractions, seed)])


def _file_bytes(directory: pathlib.Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*")) if path.is_file() and path.parent.name != "spill"
    }


def test_output_bytes_do_not_depend_on_batching_or_piece_order_and_change_with_seed(tmp_path):
    payloads = _dataset(900, random.Random(8))
    spec = _spec(compression="gzip")
    pieces = _pieces(payloads, [300, 300, 325], [0.5, 0.5], seed=1)
    _run(pieces, spec, tmp_path / "a")
    _run(list(reversed(_pieces(payloads, [1, 99, 700, 125], [0.5, 0.5], seed=1))), spec, tmp_path / "b", SPILL)
    _run(_pieces(payloads, [925], [0.5, 0.5], seed=2), spec, tmp_path / "c")
    first, second, other_seed = (_file_bytes(tmp_path / name) for name in "abc")
    assert first == second  # also: frames spilled to files or shuffled through the GroupByKey, the same output
    # Each piece's frames, keys beside; and the same again for each piece whose copies got new keys.
    spilled = sorted(path.name for path in (tmp_path / "b" / "spill").iterdir())
    assert len(spilled) >= 8 and {name + ".keys" for name in spilled if name.endswith(".bin")} == {
        name for name in spilled if name.endswith(".keys")}
    # Pieces held in this process's memory, all of them or as many as a small budget allows (the
    # rest spilled), and CRCs carried from hashing: the same output again, and nothing left held.
    budget = 2 * max(piece.num_bytes for piece in pieces)  # two pieces fit, not three
    for name, hold_bytes in (("held", 1 << 30), ("some-held", budget)):
        _run(_pieces(payloads, [300, 300, 325], [0.5, 0.5], seed=1, with_crcs=True), spec, tmp_path / name, MEMORY, hold_bytes)
        assert _file_bytes(tmp_path / name) == first
    assert not (tmp_path / "held" / "spill").exists()
    # One spilled run (and the same run in the order of its copies' new keys), keys in a file beside each (a
    # memory store holds no keys of what it spilled).
    spilled = sorted(path.name for path in (tmp_path / "some-held" / "spill").iterdir())
    assert len(spilled) in (2, 4) and {name + ".keys" for name in spilled if name.endswith(".bin")} == {
        name for name in spilled if name.endswith(".keys")}
    assert first.keys() == other_seed.keys() and first != other_seed
    # Same splits under another seed: only the order inside each split changes.
    for split in ("train", "eval"):
        assert collections.Counter(r for s in _read_split(tmp_path / "a", split) for r in s) == collections.Counter(
            r for s in _read_split(tmp_path / "c", split) for r in s
        )


def test_every_record_ten_times_gives_the_shards_of_sorting_every_run_by_frame_bytes(tmp_path):
    """A table where every record appears 10 times, some records sharing a key with others (collisions): each store
    writes exactly the bytes of sorting (split, final key, frame bytes) and cutting by rank, copy k of a record
    keyed occurrence_keys(key, k)."""
    rng = random.Random(27)
    distinct = [rng.randbytes(rng.randint(0, 30)) for _ in range(150)]
    # Records 3i, 3i+1, 3i+2 share a key: a run of 30 records, 3 different ones, 10 copies each.
    key_of = {payload: int(seeded_sort_keys(np.array([index // 3], np.uint64), 5)[0]) for index, payload in enumerate(distinct)}
    payloads = [payload for payload in distinct for _ in range(10)]
    rng.shuffle(payloads)
    pieces = []
    for start, end in ((0, 400), (400, 401), (401, 1100), (1100, 1500)):
        chunk = payloads[start:end]
        data = np.frombuffer(b"".join(chunk), dtype=np.uint8)
        offsets = np.cumsum([0] + [len(item) for item in chunk]).astype(np.int64)
        digests, crcs = record_checksums(data, offsets)
        keys = np.array([key_of[item] for item in chunk], dtype=np.uint64)
        pieces.append(KeyedRecords(split_indices(digests[:, 0], [0.7, 0.3]), keys, offsets, data, crcs=crcs))
    spec = _spec(num_shards=(4, 3))
    final = _in_final_order([(int(which), int(key), payload) for piece in pieces
                             for payload, key, which in zip(_payloads(piece), piece.key, piece.split)])
    for index, split in enumerate(spec.splits):
        ordered = [frame_records([payload]) for payload in final[index]]
        keys = {int(key) for piece in pieces for key, which in zip(piece.key, piece.split) if which == index}
        assert len(keys) < len(set(ordered))  # some keys are shared by different records
        count, shards = len(ordered), spec.num_shards[index]
        bounds = [-(-shard * count // shards) for shard in range(shards + 1)]
        expected = [b"".join(ordered[low:high]) for low, high in zip(bounds, bounds[1:])]
        for store, read_bytes in ((INLINE, None), (MEMORY, None), (SPILL, None), (SPILL, 1024)):
            # 1024: spilled parts read in small windows, so ties are checked in many small chunks.
            directory = tmp_path / f"{store}-{read_bytes}"
            with pytest.MonkeyPatch.context() as patch:
                if read_bytes:
                    patch.setattr(received_module, "SHARD_READ_BYTES", read_bytes)
                _run(pieces, spec, directory, store, budget=1 << 30)
            written = _file_bytes(directory)
            assert [written[f"{split}/{shard_file_name(split, shard, shards, None)}"] for shard in range(shards)] == expected


def _payloads(records: KeyedRecords) -> list[bytes]:
    data = records.data.tobytes()
    return [data[start:end] for start, end in zip(records.offsets[:-1].tolist(), records.offsets[1:].tolist())]


def test_ordered_mode_keeps_input_order_and_balance(tmp_path):
    payloads = [f"row-{i}".encode() for i in range(10_000)]
    spec = _spec(splits=("train",), num_shards=(7,), ordered=True)
    for store in PIECE_STORES:
        _run(_pieces(payloads, [4500, 10, 5490], [1.0], seed=None), spec, tmp_path / store, store)
        shards = _read_split(tmp_path / store, "train")
        assert [record for shard in shards for record in shard] == payloads
        assert {len(shard) for shard in shards} <= {1428, 1429}


def test_more_shards_than_records_writes_empty_shards(tmp_path):
    spec = _spec(splits=("train", "eval"), num_shards=(5, 2), bucket_bits=12)
    _run(_pieces([b"a", b"b", b"c"], [3], [0.999999, 0.000001], seed=3), spec, tmp_path)
    train, evaluation = _read_split(tmp_path, "train"), _read_split(tmp_path, "eval")
    assert sorted(len(shard) for shard in train) == [0, 0, 1, 1, 1]
    assert evaluation == [[], []]
    assert os.path.getsize(tmp_path / "eval" / "eval-00000-of-00002.tfrecord") == 0


def _one_record(size: int) -> KeyedRecords:
    return KeyedRecords(np.zeros(1, np.uint16), np.zeros(1, np.uint64), np.array([0, size]), np.zeros(size, np.uint8))


def test_discard_pieces_frees_only_that_runs_pieces(tmp_path):
    """After a failed run, the commit's cleanup frees its held pieces; another run's stay."""
    run, other = (MemoryStore(str(tmp_path / name), 150, str(tmp_path / name / "spill"), merge_runs=False)
                  for name in ("run", "other"))
    kept, others = run.add(_one_record(100)), other.add(_one_record(100))
    assert (kept.ref.store, others.ref.store) == (MEMORY, MEMORY)
    assert run.add(_one_record(100)).ref.store == SPILL  # over the run's budget: spilled
    run.flush()
    assert runs_holding_pieces() == sorted([str(tmp_path / "run"), str(tmp_path / "other")])
    discard_pieces(str(tmp_path / "run"))
    with pytest.raises(RuntimeError, match="not held in this process"):
        run.records(kept)
    assert other.records(others).lengths.tolist() == [100]
    discard_pieces(str(tmp_path / "other"))
    assert runs_holding_pieces() == []


def test_no_records_at_all_still_writes_every_shard_empty(tmp_path):
    _run([], _spec(), tmp_path)
    assert _read_split(tmp_path, "train") == [[], [], []] and _read_split(tmp_path, "eval") == [[], []]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=6), min_size=1, max_size=120), st.randoms(use_true_random=False))
def test_shard_writer_frames_parts_of_every_store(payloads, rng):
    """Slices of a piece held in memory (ordered in place) and of an inline (framed) piece, written by one writer."""
    from tfrbeam.builder.shuffle.received import Received

    data = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    offsets = np.cumsum([0] + [len(item) for item in payloads]).astype(np.int64)
    _, crcs = record_checksums(data, offsets)
    keys = np.array([rng.getrandbits(64) for _ in payloads], dtype=np.uint64)
    records = KeyedRecords(np.zeros(len(payloads), np.uint16), keys, offsets, data, crcs)
    store = MemoryStore("a-run", 1 << 20, "unused-spill-dir")
    try:
        held, inline = store.add(records), _prepared(records)
        assert held.ref.store == MEMORY and held.offsets.tolist() == inline.offsets.tolist()
        cut = rng.randint(0, len(payloads))
        parts = [part for part in (held.slice(0, cut), inline.slice(cut, len(payloads))) if len(part)]
        received = Received(parts, store)
        in_key_order = [payloads[index] for index in sorted(range(len(payloads)), key=lambda index: int(keys[index]))]
        shuffled = list(range(len(payloads)))
        rng.shuffle(shuffled)
        shuffled = np.array(shuffled, dtype=np.int64)
        assert received.frames(shuffled) == frame_records([in_key_order[index] for index in shuffled])
        assert received.frame(len(payloads) - 1) == frame_records([in_key_order[-1]])
    finally:
        discard_pieces("a-run")


def test_held_pieces_survive_rerouting_and_retried_writes(tmp_path):
    """Each writer bundle routes every piece again and a retried shard write releases its slice again:
    a piece is dropped after its last distinct shard, routing a dropped piece is no error, and the
    run's holding ends with its last shard."""
    store = MemoryStore(str(tmp_path), 100, str(tmp_path / "spill"))
    piece = store.add(_one_record(10))
    store.routed(piece, 2)
    store.routed(piece, 2)  # routed again by another bundle: counted once
    store.written(piece, 0)
    store.written(piece, 0)  # the shard-0 write retried
    assert store.records(piece).lengths.tolist() == [10]
    store.written(piece, 1)
    with pytest.raises(RuntimeError, match="already dropped"):
        store.records(piece)
    store.routed(piece, 2)  # a later bundle routes the finished piece: nothing to hold any more
    store.written(piece, 1)
    store.shard_written(0, 2)
    assert runs_holding_pieces() == [str(tmp_path)]
    store.shard_written(1, 2)
    assert runs_holding_pieces() == []


def test_a_shard_writer_reads_spilled_parts_a_window_at_a_time(tmp_path, monkeypatch):
    """Memory bound: however big a shard, a writer reads a spilled part at most its share of
    SHARD_READ_BYTES at once (plus one record), and writes the same bytes as when it read it whole."""
    from tfrbeam.builder.shuffle import held, received, write

    rng = random.Random(21)
    payloads = [rng.randbytes(rng.randint(8, 40)) for _ in range(3025)]  # ~60 KB of records, two pieces, one shard
    assert len(set(payloads)) == len(payloads)  # no copies to move: the pieces are read by the writer alone
    spec = _spec(splits=("train",), num_shards=(1,))
    pieces = _pieces(payloads, [1500, 1525], [1.0], seed=4, with_crcs=True)
    _run(pieces, spec, tmp_path / "whole")
    reads: list[int] = []
    read_spilled = held.read_spilled

    def counted(path, offset, size, what):
        reads.append(size)
        return read_spilled(path, offset, size, what)

    monkeypatch.setattr(held, "read_spilled", counted)
    monkeypatch.setattr(received, "SHARD_READ_BYTES", 4096)
    monkeypatch.setattr(write, "WRITE_BLOCK_BYTES", 2048)  # a block needs less than a window
    for store, budget in ((SPILL, 0), (MEMORY, 0)):  # a memory store over its budget spills every piece
        reads.clear()
        _run(_pieces(payloads, [1500, 1525], [1.0], seed=4, with_crcs=True), spec, tmp_path / store, store, budget)
        assert _file_bytes(tmp_path / store)["train/train-00000-of-00001.tfrecord"] == (
            _file_bytes(tmp_path / "whole")["train/train-00000-of-00001.tfrecord"]
        )
        largest = max(len(record) for record in payloads) + RECORD_OVERHEAD
        # Every record was read, once: a window keeps what the next one needs of it.
        assert sum(reads) == sum(piece.data.nbytes + RECORD_OVERHEAD * len(piece.key) for piece in pieces)
        assert 0 < max(reads) <= 4096 // 2 + largest, store


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=16, max_value=5000), max_size=200), st.integers(1, 20), st.integers(16, 20000))
def test_write_blocks_cover_every_record_once_within_both_bounds(lengths, max_records, max_bytes):
    from tfrbeam.builder.shuffle import write

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(write, "WRITE_BLOCK_RECORDS", max_records)
        patch.setattr(write, "WRITE_BLOCK_BYTES", max_bytes)
        blocks = write.write_blocks(np.array(lengths, dtype=np.int64))
    assert [index for start, end in blocks for index in range(start, end)] == list(range(len(lengths)))
    for start, end in blocks:
        assert end - start <= max_records
        assert end - start == 1 or sum(lengths[start:end]) <= max_bytes


def test_memory_store_pieces_cross_the_runner_as_their_names(tmp_path):
    """Memory bound: a memory store's pieces (held, or spilled past its budget) cross the runner as their
    names, so the runner's buffers and side inputs hold a name per piece, not 12 bytes a record.
    Decoding finds the very same held piece; a spilled one's keys wait in a file beside its frames
    (none in memory: 18 bytes a record until the shards are written), so it decodes to the name,
    and the writers read the keys back. After the run a name is refused, not silently empty."""
    store = MemoryStore(str(tmp_path), 40_000, str(tmp_path / "spill"), merge_runs=False)
    coder = PieceCoder()
    payloads = _dataset(2000, random.Random(5))
    held, spilled = (store.add(records) for records in _pieces(payloads, [1000, 1025], [1.0], seed=2))
    store.flush()
    assert (held.ref.store, spilled.ref.store) == (MEMORY, SPILL)
    for piece in (held, spilled):
        encoded = coder.encode(piece)
        assert len(encoded) < 200 and coder.estimate_size(piece) == len(encoded)
    assert coder.decode(coder.encode(held)) is held
    standing_in = coder.decode(coder.encode(spilled))
    where = operator.attrgetter("store", "location", "offset", "run")
    assert len(standing_in) == 0 and where(standing_in.ref) == where(spilled.ref)
    for name, whole, part in ((name, store.with_keys(standing_in), store.slice_of(standing_in, 100, 900))
                              for name in ("split", "key", "offsets")):
        assert getattr(whole, name).tolist() == getattr(spilled, name).tolist()
        assert getattr(part, name).tolist() == getattr(spilled.slice(100, 900), name).tolist()
    assert where(store.slice_of(standing_in, 100, 900).ref) == where(spilled.slice(100, 900).ref)
    part = held.slice(10, 20)  # a slice is not a piece the store made: it carries its keys
    decoded = coder.decode(coder.encode(part))
    assert decoded.key.tolist() == part.key.tolist() and decoded.ref.offset == part.ref.offset
    encoded = coder.encode(held)
    discard_pieces(str(tmp_path))
    with pytest.raises(RuntimeError, match="is not held in this process"):
        coder.decode(encoded)


def test_a_piece_crosses_the_runner_in_12_bytes_a_record_and_decodes_to_the_same_arrays():
    """What crosses the runner per record is its sort key and a 4-byte frame offset; the splits go as runs (a piece is
    sorted by split). Wider offsets (a piece past 4 GiB) and unsorted splits still decode exactly."""
    coder = PieceCoder()
    count = 10_000
    key = np.arange(count, dtype=np.uint64) * 7919
    offsets = np.arange(count + 1, dtype=np.int64) * 300
    split = np.repeat(np.array([0, 1, 2], dtype=np.uint16), [5000, 3000, 2000])
    piece = Piece(split, key, offsets, PieceRef(SPILL, location="spill/a.bin", offset=11))
    encoded = coder.encode(piece)
    assert len(encoded) < 12 * count + 100 and coder.estimate_size(piece) == len(encoded)
    wide = Piece(split[:3], key[:3], np.array([0, 1 << 31, 5 << 31, 6 << 31], dtype=np.int64), piece.ref)
    shuffled = Piece(np.array([1, 0, 1, 1, 2], dtype=np.uint16), key[:5], offsets[:6], piece.ref)
    empty = Piece.empty()
    for value in (piece, piece.slice(4000, 9000), wide, shuffled, empty):
        decoded = coder.decode(coder.encode(value))
        for field in ("split", "key", "offsets"):
            assert getattr(decoded, field).tolist() == getattr(value, field).tolist()
        assert decoded.offsets.dtype == np.int64 and coder.estimate_size(value) == len(coder.encode(value))


def test_a_spill_file_changed_on_disk_is_refused_naming_it_and_the_record(tmp_path):
    """A spill file is read back by the run that wrote it; if its bytes changed meanwhile (a bad disk, another
    process), the writer refuses them instead of framing a damaged payload into a shard."""
    from tfrbeam.builder.shuffle import SpillStore
    from tfrbeam.errors import ShuffledDataError

    payloads = [b"record %d " % index * (index % 7 + 1) for index in range(400)]
    store = SpillStore(str(tmp_path / "spill"))
    piece = store.add(_pieces(payloads, [400], [1.0], seed=3)[0])
    store.flush()
    whole = store.records(piece)
    assert len(whole.lengths) == 400
    path = pathlib.Path(piece.ref.location)
    data = bytearray(path.read_bytes())
    record = 123
    at = int(piece.offsets[record]) + 14  # inside record 123's payload (after its 12-byte header)
    data[at] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(ShuffledDataError, match=rf"{path}: record 23 of the 100 read from byte "
                                                rf"{int(piece.offsets[100])} .*data CRC") as caught:
        store.records(piece.slice(100, 200))
    assert "changed or damaged on disk" in str(caught.value)
    assert len(store.records(piece.slice(200, 400)).lengths) == 200  # the rest of the file is whole
