"""Seeded global shuffle, hash splits and exactly balanced shards, written to a temp location.

The modules, in the order a record meets them: ``keys`` (digests, sort keys, splits; no Beam),
``pieces`` (the shuffled unit), ``stores`` (where pieces wait; ``held``, the spilling store a memory
store shares with a sequence build's held rows), ``coders``, ``copies`` (the tally of
copies), ``balance`` (bucket counts and the shard plan), ``route`` (pieces cut by shard), ``received``
and ``write`` (the shard writer) and ``transform`` (the Beam transforms). This package re-exports
their public names. TFRecord framing itself is ``tfrbeam.tfrecord.frames``. May import the layers
below the build and, within it, only ``tfrbeam.builder.inputs.progress``: the config, plan and
graph import the shuffle, never the other way.

How a record finds its place (the same on every runner, worker count, input order and batching):

- Content digest: XXH3-128 (xxHash >= 0.8, seed 0, canonical big-endian digest) of the
  serialized Example, read as two little-endian 64-bit words. XXH3 passes SMHasher, so its bits
  are well mixed for any content; it is not cryptographic (nobody crafts collisions against their
  own dataset, and equal keys are still ordered by bytes). Per ~400-byte record it costs a
  quarter of blake2b, which the build used before. The digest's first 64 bits place the record
  in a split; its second 64 bits, passed through a bijective 64-bit mixer
  keyed by the seed (four rounds of xor-with-a-seed-derived-key then the splitmix64 finaliser), are
  the record's key. Identical records get identical keys, so copies always fall in the same split
  (no train/eval leakage).
- Copies: the k-th copy (k = 0, 1, ...) of a record in a split gets its own sort key,
  ``occurrence_keys(key, k)``: copy 0 keeps the key, copy k > 0 the bijection of key + k times an
  odd constant. Copies are records with equal split, key, frame length and CRC32C (records that
  only share a key keep it, ordered by bytes; two records made to share all four would be numbered
  as copies and could then swap places with the input's cutting into pieces). Copies are
  identical, so which one gets which number changes no byte; a tally over
  all pieces (``copies.TallyCopies``: pieces cut by key range, one GroupByKey, names or keys
  crossing, never frames) numbers them, gives each piece a disjoint range of the numbers and makes
  the bucket counts of the final keys. A piece whose records got new keys is put in order again
  by its store before it is routed (``PieceStore.rekeyed``: framed again by inline and spill,
  moved by its keys for a piece held in memory). The output order is sorted by (sort key, record
  bytes): a uniformly random permutation of all records, copies included, for each seed. A dataset
  without copies keeps the order it had before copies had keys of their own.
- Splits: the split hash (of ``split_key``'s values, or of the whole record) is compared with the
  cumulative fractions scaled to 2**64. It does not depend on the seed: changing the seed
  reorders examples within splits but never moves one between splits.
- Without shuffling the sort key is ``input file index << 40 | row number`` (file index = position
  of the path in the sorted input list), so examples keep input file order, then row order.

Exact balance: every split's records are counted per bucket (hash mode: the top ``bucket_bits``
bits of the final sort key, counted by the tally of copies, about 64 buckets per shard; ordered
mode: blocks of 4096 consecutive rows of one piece) by a combine that carries only counts. From
those counts the plan gives each bucket its first global rank; shard s of k receives global ranks
``[ceil(s*n/k), ceil((s+1)*n/k))``, so shard sizes differ by at most one record. With ``max_bytes_per_shard``
the plan picks the smallest k for which every shard provably fits.

Moving the bytes: each input piece is put in (split, key) order, so a shard's part of a piece is
one contiguous slice, and waits in a piece store (``PieceStore``: ``add`` a piece, get it back as
a ``Piece`` of keys, frame offsets and a reference; ``records`` of a slice read it back), chosen
once when the build is planned:

- ``inline``: the piece is framed once as TFRecords into a new buffer in key order (numpy copies
  payloads per group of equal length and writes every header and footer at once; the payload
  CRCs come with the piece, computed while its records were hashed), and the frames travel in
  the elements. One element per (piece, shard) crosses the GroupByKey: the frames as one buffer
  plus numpy arrays of keys and offsets, with a coder that is a few memcpys; boundary buckets go
  to both neighbouring shards (about 1/64 of a shard each).
- ``spill``: framed the same way, the frames go to files under the temp dir, each piece's keys,
  splits, frame offsets and footers (CRCs) to a file beside them; a piece and each of its shard
  slices cross Beam as a stub (a file and a record range, ``Piece.stub``), and the tally, router
  and writers read back the keys and frames they need: the runner, which holds a GroupByKey's
  elements until the build ends, holds no array of records. Same graph as inline
  (``WriteShardsThroughGroupByKey``): the pieces reach the routing stage through a GroupByKey
  too (``GroupPieces``) and no Flatten takes them or their slices, since Beam's FnApiRunner drops
  chunks of any other large stage input it sends to a worker process (docs/runners.md).
- ``memory``: the payloads stay in this process's memory where the encoder put them (only when
  every worker runs in it), up to a byte budget per run, beyond which pieces are spilled (their
  keys too, to a file beside their frames: memory does not grow with what is spilled). A held
  piece is ordered by moving its keys only (no copy); the writers frame its records from there.
  No piece carries bytes, so the writers read them all as a side input and cut their own slices:
  no routing stage and no GroupByKey, each a whole stage on the local runners
  (``WriteShardsFromPieceList``). A piece is dropped once its last shard slice is written, the
  run's holding once its last shard is written (or by ``discard_pieces`` after a failure):
  nothing outlives the run. Its registry, budget and spill are ``held``'s, shared with the rows a
  sequence build holds (``tfrbeam.builder.pipeline.held_rows``).

A shard writer merges its slices by (key, frame bytes), keeps its exact rank range and writes the
frames (header and footer bytes made with numpy, one join per block). No element is larger than
one piece and no worker holds more than one shard.
"""

from __future__ import annotations

from tfrbeam.builder.shuffle.balance import BucketCounts, ShardingSpec, ShardPlan, SplitPlan, make_plan
from tfrbeam.builder.shuffle.coders import KeyedRecordsCoder, PieceCoder
from tfrbeam.builder.shuffle.copies import RangeCounts, TallyCopies, tally_copies
from tfrbeam.builder.shuffle.keys import (
    FILE_INDEX_BITS,
    MAX_BUCKET_BITS,
    MIN_BUCKET_BITS,
    ROW_NUMBER_BITS,
    bucket_bits_for,
    content_digests,
    input_order_keys,
    key_range_bounds,
    occurrence_keys,
    payload_crcs,
    record_checksums,
    seeded_sort_keys,
    split_indices,
)
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
    keyed_pieces,
)
from tfrbeam.builder.shuffle.stores import (
    InlineStore,
    MemoryStore,
    PieceStore,
    SpillStore,
    discard_pieces,
    make_piece_store,
    runs_holding_pieces,
)
from tfrbeam.builder.shuffle.transform import WriteShardsFromPieceList, WriteShardsThroughGroupByKey, WriteShuffledShards
from tfrbeam.builder.shuffle.write import WrittenShard, write_blocks

__all__ = [
    "FILE_INDEX_BITS",
    "INLINE",
    "MAX_BUCKET_BITS",
    "MEMORY",
    "MIN_BUCKET_BITS",
    "PIECE_STORES",
    "ROW_NUMBER_BITS",
    "SPILL",
    "BucketCounts",
    "InlineStore",
    "KeyedRecords",
    "KeyedRecordsCoder",
    "MemoryStore",
    "MovedCopies",
    "Piece",
    "PieceCoder",
    "PieceRef",
    "PieceStore",
    "RangeCounts",
    "TallyCopies",
    "WrittenShard",
    "ShardPlan",
    "ShardingSpec",
    "SpillStore",
    "SplitPlan",
    "StoredRecords",
    "WriteShardsFromPieceList",
    "WriteShardsThroughGroupByKey",
    "WriteShuffledShards",
    "bucket_bits_for",
    "content_digests",
    "discard_pieces",
    "input_order_keys",
    "key_range_bounds",
    "keyed_pieces",
    "make_piece_store",
    "make_plan",
    "occurrence_keys",
    "payload_crcs",
    "record_checksums",
    "runs_holding_pieces",
    "seeded_sort_keys",
    "split_indices",
    "tally_copies",
    "write_blocks",
]
