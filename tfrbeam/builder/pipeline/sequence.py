"""The sequence stage of a SequenceExample build: rows keyed by a bucket of their group key, then grouped, sorted, encoded.

- **Keying** (in the converter, ``GroupKeyer``): the group key's hash is XXH3-128 of the row's
  ``group_by`` features encoded as an Example (as the split hash is taken). Rows whose key has a
  null are bad rows. Every row keeps its input file index and line, and goes to bucket
  ``hash[1] % buckets`` as part of one Arrow batch per (source batch, bucket).
- **Grouping** is the runner's GroupByKey on the bucket: a group never spans buckets, and the
  bucket count (``sequence_buckets_for``, fixed when the build is planned) bounds the bytes of
  one bucket, which one worker holds at a time. When every worker runs in this process (piece
  store ``memory``) the batches stay here (``tfrbeam.builder.pipeline.held_rows``) and only ``HeldRows``
  references go through the GroupByKey; the encoder frees a bucket's batches once it is encoded.
- **Per bucket** (``sequences_of``): rows sorted by (group key hash, order_by, the row's content
  hash, input file, line) with pyarrow's sort (nulls last): a total order that depends on no
  input order (only rows tied on group and order_by are hashed). A group whose context feature
  varies is a bad group, one shorter than min_steps is dropped, a longer one is cut by max_steps
  (split, truncate, or a bad group with overflow: error), and a group kept whole whose
  SequenceExample exceeds max_group_bytes fails the build. The kept sequences are encoded at
  once (``encode_sequence_chunks``: runs of groups in buffers of their own, which become the
  shuffle's pieces as they are) and keyed for the shuffle exactly as Examples are: the split
  from the split_key hash of the group, the sort key from the seeded content hash of the
  SequenceExample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import tfrbeam.beam.arrow_coder  # noqa: F401  (registers the RecordBatch coder for the GroupByKey's values)
from tfrbeam.builder.config import SequenceConfig
from tfrbeam.builder.features.convert import BadRow, ConvertedBatch, FeatureSpec, Provenance, rows_as_json
from tfrbeam.builder.pipeline.held_rows import HeldRows, held_batches, hold_rows, release_rows
from tfrbeam.builder.shuffle import (
    MEMORY,
    ROW_NUMBER_BITS,
    KeyedRecords,
    content_digests,
    keyed_pieces,
    record_checksums,
    seeded_sort_keys,
    split_indices,
)
from tfrbeam.codec.encode import EncodedExamples, encode_record_batch
from tfrbeam.codec.kinds import is_list
from tfrbeam.codec.sequence_encode import encode_sequence_chunks
from tfrbeam.errors import BadRecordError, GroupTooLargeError

if TYPE_CHECKING:
    from tfrbeam.builder.pipeline.plan import BuildPlan

__all__ = [
    "GroupKeyer", "SequenceCounts", "SequenceStage", "Sequences", "EncodeSequences", "key_hashes", "sequences_of",
]

# Columns the converter adds to each row for the grouping (never features: the encoder ignores them).
FILE_COLUMN, LINE_COLUMN = "__tfrbeam_file", "__tfrbeam_line"
GROUP_COLUMNS = ("__tfrbeam_group0", "__tfrbeam_group1")
BAD_ROWS, STATS = "bad_rows", "sequence_stats"


def group_hashes(batch: pa.RecordBatch | pa.Table, names: Sequence[str]) -> np.ndarray:
    """XXH3-128 (two uint64 words per row) of each row's ``names`` features encoded as an Example."""
    encoded = encode_record_batch(batch.select(list(names)))
    return content_digests(encoded.data, encoded.offsets)


def key_hashes(batch: pa.RecordBatch | pa.Table, names: Sequence[str]) -> np.ndarray:
    """``group_hashes`` of every row, with each distinct key encoded and hashed once.

    A group's rows share their key, so a batch holds far fewer keys than rows. Keys are told apart
    by pyarrow's dictionary encoding, which equals the encoded bytes' equality for integers,
    booleans, strings and binaries; keys of other types (floats: -0.0 and NaN payloads; lists),
    or with nulls, are hashed row by row.
    """
    columns = [batch.column(name) for name in names]
    if not columns or any(column.null_count or not _dictionary_exact(column.type) for column in columns):
        return group_hashes(batch, names)
    codes, distinct = _dictionary_codes(columns[0])
    for column in columns[1:]:  # the pair of codes as one number (below rows**2), numbered again from 0
        more, count = _dictionary_codes(column)
        codes, distinct = _dictionary_codes(pa.array(codes * count + more))
    first_rows = np.full(distinct, len(codes), dtype=np.int64)
    np.minimum.at(first_rows, codes, np.arange(len(codes), dtype=np.int64))
    return group_hashes(batch.select(list(names)).take(pa.array(first_rows)), names)[codes]


def _dictionary_codes(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """Each value's number among the column's distinct values (0 up, in order of first appearance), and their count."""
    if isinstance(column, pa.ChunkedArray):  # a table's column: one dictionary for all its chunks
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
    return np.asarray(encoded.indices, dtype=np.int64), len(encoded.dictionary)


def _dictionary_exact(arrow_type: pa.DataType) -> bool:
    """Whether two values of this type are equal exactly when their Example encodings are."""
    types = pa.types
    return (types.is_integer(arrow_type) or types.is_boolean(arrow_type) or types.is_string(arrow_type)
            or types.is_large_string(arrow_type) or types.is_binary(arrow_type) or types.is_large_binary(arrow_type))


# ------------------------------------------------------------------------------------ keying


@dataclasses.dataclass(frozen=True)
class GroupKeyer:
    """The converter's part: rows with a null key out as bad rows, the rest in batches keyed by their bucket.

    ``held_under``: the run's staging directory when its workers all run in this process (piece
    store ``memory``): each batch then stays here (``tfrbeam.builder.pipeline.held_rows``), up to
    ``held_budget`` bytes in memory and spilled past it, and only a ``HeldRows`` reference goes
    through the GroupByKey; None sends the batches themselves.
    """

    group_by: tuple[str, ...]
    buckets: int
    held_under: str | None = None
    held_budget: int | None = None

    @classmethod
    def of(cls, plan: BuildPlan) -> GroupKeyer:
        """The keyer of a sequence build's plan: its group_by and bucket count, holding rows on in-process runs.

        The held rows get the memory store's budget (``--memory_store_bytes``), as its pieces do.
        """
        assert plan.config.sequence is not None  # only sequence builds key rows by group
        if plan.piece_store != MEMORY:
            return cls(plan.config.sequence.group_by, plan.sequence_buckets)
        return cls(plan.config.sequence.group_by, plan.sequence_buckets, plan.staging_dir, plan.memory_store_bytes)

    @property
    def element_type(self) -> Any:
        """The type of what the converter emits per bucket: (bucket, batch), or (bucket, reference) when rows are held."""
        return tuple[int, HeldRows] if self.held_under is not None else tuple[int, pa.RecordBatch]

    def without_null_keys(self, source: Provenance, converted: ConvertedBatch) -> ConvertedBatch:
        """``converted`` with the rows whose group key has a null moved to its bad rows."""
        batch = converted.batch
        nulls = np.zeros(batch.num_rows, dtype=bool)
        first_null: dict[int, str] = {}
        for name in self.group_by:
            column = batch.column(name)
            if column.null_count:
                is_null = np.asarray(column.is_null(), dtype=bool)
                for row in np.flatnonzero(is_null & ~nulls).tolist():
                    first_null[row] = name
                nulls |= is_null
        if not nulls.any():
            return converted
        rows = np.flatnonzero(nulls)
        inputs = converted.kept_rows[rows]
        texts = source.raw_text(inputs.tolist())
        lines = np.asarray(source.lines)[inputs].tolist()
        bad = [BadRow(source.path, int(line), f"sequence.group_by feature {first_null[row]!r} is null (a SequenceExample "
                      "needs its whole group key; on_null: default gives the key a value)", text)
               for row, line, text in zip(rows.tolist(), lines, texts)]
        keep = np.flatnonzero(~nulls)
        return ConvertedBatch(batch=batch.take(pa.array(keep)), bad_rows=converted.bad_rows + bad,
                              kept_rows=converted.kept_rows[keep])

    def rows_by_bucket(self, batch: pa.RecordBatch, file_index: int, lines: np.ndarray) -> Iterator[tuple[int, Any]]:
        """(bucket, rows) for every bucket the batch's rows fall in; each row carries its file, line and group hash.

        The batch is sorted by bucket once and each bucket's rows are a slice of that: a take per
        bucket cost one call per (source batch, bucket), a number that grows with rows times
        buckets. (The slices share the sorted batch's buffers, which live while any of them is held
        in memory; held rows are counted by their slices' bytes, which add up to the batch's.)
        """
        digests = key_hashes(batch, self.group_by)
        extra = [pa.array(np.full(batch.num_rows, file_index, dtype=np.int32)), pa.array(np.asarray(lines, dtype=np.int64)),
                 pa.array(digests[:, 0]), pa.array(digests[:, 1])]
        keyed = pa.RecordBatch.from_arrays([*batch.columns, *extra],
                                           names=[*batch.schema.names, FILE_COLUMN, LINE_COLUMN, *GROUP_COLUMNS])
        bucket = digests[:, 1] % np.uint64(self.buckets)
        if not len(bucket) or bucket.min() == bucket.max():
            yield (int(bucket[0]) if len(bucket) else 0), self._sent(keyed, int(bucket[0]) if len(bucket) else 0)
            return
        order = np.argsort(bucket, kind="stable")
        bucket = bucket[order]
        by_bucket = keyed.take(pa.array(order))
        row_bytes = by_bucket.get_total_buffer_size() / max(by_bucket.num_rows, 1)  # its own buffers: exact
        bounds = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1], True])
        for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            yield int(bucket[start]), self._sent(by_bucket.slice(start, end - start), int(bucket[start]),
                                                 round(row_bytes * (end - start)))

    def _sent(self, rows: pa.RecordBatch, bucket: int = 0, size: int | None = None) -> pa.RecordBatch | HeldRows:
        """What goes through the GroupByKey for ``rows`` (of ``size`` bytes): the batch, or a reference to it held here."""
        return rows if self.held_under is None else hold_rows(self.held_under, rows, self.held_budget, bucket, size)


# ------------------------------------------------------------------------------------ counts


@dataclasses.dataclass(frozen=True, eq=False)
class SequenceCounts:
    """Per split (first axis), what the sequence stage made of its rows; summed over buckets by the commit.

    Rows: every row that reached the stage is in exactly one of steps (kept), too_few_rows,
    bad_rows (rows of bad groups) and truncated_steps.
    """

    examples: np.ndarray  # SequenceExamples written
    groups: np.ndarray  # groups kept (a split group counts once)
    steps: np.ndarray  # steps written
    min_steps: np.ndarray  # fewest steps of one SequenceExample (int64 max when none)
    max_steps: np.ndarray
    too_few_groups: np.ndarray
    too_few_rows: np.ndarray
    bad_groups: np.ndarray
    bad_rows: np.ndarray
    split_groups: np.ndarray  # groups cut into more than one SequenceExample
    truncated_steps: np.ndarray
    context_present: np.ndarray  # (splits, context features): SequenceExamples that have the feature
    steps_present: np.ndarray  # (splits, sequence features): steps that hold a value

    @classmethod
    def zeros(cls, splits: int, context: int, sequence: int) -> SequenceCounts:
        zero = np.zeros(splits, dtype=np.int64)
        return cls(zero, zero, zero, np.full(splits, np.iinfo(np.int64).max), zero, zero, zero, zero, zero, zero, zero,
                   np.zeros((splits, context), np.int64), np.zeros((splits, sequence), np.int64))

    def __add__(self, other: SequenceCounts) -> SequenceCounts:
        fields = {}
        for item in dataclasses.fields(self):
            mine, theirs = getattr(self, item.name), getattr(other, item.name)
            combine = np.minimum if item.name == "min_steps" else np.maximum if item.name == "max_steps" else np.add
            fields[item.name] = combine(mine, theirs)
        return SequenceCounts(**fields)

    @property
    def rows(self) -> int:
        """Every row the stage received: kept steps, rows of too-short and of bad groups, truncated steps."""
        return int(self.steps.sum() + self.too_few_rows.sum() + self.bad_rows.sum() + self.truncated_steps.sum())


# ------------------------------------------------------------------------------------ per bucket


@dataclasses.dataclass(frozen=True)
class SequenceStage:
    """Everything the per-bucket stage needs, taken from the plan (pickled into the workers)."""

    sequence: SequenceConfig
    features: tuple[FeatureSpec, ...]
    split_key: tuple[str, ...]
    fractions: tuple[float, ...]
    seed: int | None  # None: no shuffle, SequenceExamples in the input order of their first rows
    action: str  # errors.on_bad_record
    input_paths: tuple[str, ...]  # by file index (sorted paths)

    @classmethod
    def of(cls, plan: BuildPlan) -> SequenceStage:
        config = plan.config
        assert config.sequence is not None  # only sequence builds have this stage
        return cls(sequence=config.sequence, features=plan.features, split_key=config.split_key or config.sequence.group_by,
                   fractions=config.fractions, seed=config.shuffle.effective_seed,
                   action=config.errors.on_bad_record, input_paths=tuple(sorted(item.path for item in plan.input_files)))

    @property
    def context(self) -> tuple[str, ...]:
        return self.sequence.context_features

    @property
    def feature_lists(self) -> tuple[str, ...]:
        return self.sequence.sequence_features(self.features)

    def zero_counts(self) -> SequenceCounts:
        return SequenceCounts.zeros(len(self.fractions), len(self.context), len(self.feature_lists))


@dataclasses.dataclass(frozen=True, eq=False)
class Sequences:
    """What one bucket became: encoded SequenceExamples with their split and shuffle key, bad rows and counts.

    The records are in ``chunks`` (consecutive runs of them, each in its own buffer, as the
    encoder made them: joining them would copy every byte once more); split, key and CRC are per
    record over all chunks.
    """

    split: np.ndarray
    key: np.ndarray
    chunks: tuple[EncodedExamples, ...]
    crcs: np.ndarray
    bad_rows: list[BadRow]
    counts: SequenceCounts

    def pieces(self, piece_bytes: int) -> Iterator[KeyedRecords]:
        """The records keyed for the shuffle, in pieces of at most ``piece_bytes`` (none spans two chunks)."""
        first = 0
        for chunk in self.chunks:
            end = first + len(chunk)
            yield from keyed_pieces(self.split[first:end], self.key[first:end], chunk.offsets, chunk.data,
                                    self.crcs[first:end], piece_bytes)
            first = end


@dataclasses.dataclass(frozen=True, eq=False)
class _Groups:
    """A bucket's rows in step order (as positions into its table) and its groups: first position, size and split."""

    features: pa.Table  # the bucket's features, in the order the rows arrived
    order: np.ndarray  # sorted position -> row of ``features``
    starts: np.ndarray
    sizes: np.ndarray
    split: np.ndarray
    files: np.ndarray  # per sorted position
    lines: np.ndarray

    def rows(self, group: int) -> pa.Table:
        start = int(self.starts[group])
        return self.features.take(pa.array(self.order[start:start + int(self.sizes[group])]))

    def neighbours_in_a_group(self) -> np.ndarray:
        """For each sorted position but the last: whether the next row is of the same group."""
        same = np.ones(max(len(self.order) - 1, 0), dtype=bool)
        same[self.starts[1:] - 1] = False
        return same


def sequences_of(table: pa.Table, stage: SequenceStage) -> Sequences:
    """Group, check, cut and encode one bucket's rows (the features plus the converter's file, line and group hash)."""
    groups = _sorted_groups(table, stage)
    sequence = stage.sequence
    counts = stage.zero_counts()
    reasons = _bad_group_reasons(groups, stage)
    bad = np.array([reason is not None for reason in reasons], dtype=bool)
    too_few = ~bad & (groups.sizes < sequence.min_steps)
    kept = ~bad & ~too_few
    bad_rows = _bad_group_rows(groups, reasons, stage)
    counts = dataclasses.replace(
        counts, too_few_groups=_per_split(groups.split[too_few], counts), too_few_rows=_per_split(
            groups.split[too_few], counts, groups.sizes[too_few]),
        bad_groups=_per_split(groups.split[bad], counts), bad_rows=_per_split(groups.split[bad], counts, groups.sizes[bad]))
    return _encode_kept(groups, kept, stage, counts, bad_rows)


def _sorted_groups(table: pa.Table, stage: SequenceStage) -> _Groups:
    """The rows sorted by (group key hash, order_by, content hash, file, line), and where each group starts."""
    features = table.select([spec.name for spec in stage.features])
    sort_columns = {"g0": table.column(GROUP_COLUMNS[0]), "g1": table.column(GROUP_COLUMNS[1])}
    sort_columns.update({f"o{index}": table.column(name) for index, name in enumerate(stage.sequence.order_by)})
    sort_columns.update(f=table.column(FILE_COLUMN), line=table.column(LINE_COLUMN))
    # pyarrow places nulls (and NaN) last by default; naming null_placement is deprecated in pyarrow 25, per key unknown to 14.
    order = np.asarray(pc.sort_indices(pa.table(sort_columns), sort_keys=[(name, "ascending") for name in sort_columns]),
                       dtype=np.int64)
    g0 = np.asarray(table.column(GROUP_COLUMNS[0]))[order]
    g1 = np.asarray(table.column(GROUP_COLUMNS[1]))[order]
    starts = np.flatnonzero(np.r_[True, (g0[1:] != g0[:-1]) | (g1[1:] != g1[:-1])]) if len(order) else np.zeros(0, np.int64)
    files, lines = np.asarray(table.column(FILE_COLUMN)), np.asarray(table.column(LINE_COLUMN))
    groups = _Groups(features=features, order=order, starts=starts, sizes=np.diff(np.r_[starts, len(order)]),
                     split=np.zeros(len(starts), np.int64), files=files[order], lines=lines[order])
    order = _by_content_among_ties(groups, stage)
    if tuple(stage.split_key) == tuple(stage.sequence.group_by):
        split_hash = g0[starts]  # the same XXH3-128 of the same encoded features, computed once
    else:
        split_hash = group_hashes(features.take(pa.array(order[starts])), stage.split_key)[:, 0]
    return dataclasses.replace(groups, order=order, split=split_indices(split_hash, stage.fractions).astype(np.int64),
                               files=files[order], lines=lines[order])


def _by_content_among_ties(groups: _Groups, stage: SequenceStage) -> np.ndarray:
    """The sorted order with each run of rows equal in group and order_by sorted by content hash, then file and line.

    Only tied rows are hashed (XXH3-128 of the row encoded as an Example): with a timestamp in
    order_by, few are.
    """
    order = groups.order
    tie = groups.neighbours_in_a_group()
    for name in stage.sequence.order_by:
        if not tie.any():
            break
        tie &= _neighbours_equal(groups.features.column(name).take(pa.array(order)), exact=False)
    if not tie.any():
        return order
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= tie
    tied[:-1] |= tie
    positions = np.flatnonzero(tied)
    encoded = encode_record_batch(groups.features.take(pa.array(order[positions])))
    digests = content_digests(encoded.data, encoded.offsets)
    run_start = np.maximum.accumulate(np.where(np.r_[True, ~tie], np.arange(len(order)), 0))[positions]
    within_runs = np.lexsort((groups.lines[positions], groups.files[positions], digests[:, 1], digests[:, 0], run_start))
    order = order.copy()
    order[positions] = order[positions[within_runs]]  # each run's positions are contiguous: rows move within their run
    return order


def _neighbours_equal(column: pa.Array | pa.ChunkedArray, exact: bool) -> np.ndarray:
    """For each position but the last: whether the next value equals it (two nulls are equal).

    exact: floats by their bits (as their encoding compares); else as the sort compares them
    (-0.0 equals 0.0, NaN equals NaN).
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_floating(column.type) and exact:
        column = column.view(pa.int32() if column.type.bit_width == 32 else pa.int64())
    before, after = column.slice(0, len(column) - 1), column.slice(1)
    both_null = pc.and_(before.is_null(), after.is_null())
    equal = pc.or_(pc.fill_null(pc.equal(before, after), False), both_null)
    if pa.types.is_floating(column.type):
        equal = pc.or_(equal, pc.fill_null(pc.and_(pc.is_nan(before), pc.is_nan(after)), False))
    return np.asarray(equal, dtype=bool)


def _per_split(split: np.ndarray, counts: SequenceCounts, weights: np.ndarray | None = None) -> np.ndarray:
    return np.bincount(split, weights=weights, minlength=len(counts.examples)).astype(np.int64)


def _bad_group_reasons(groups: _Groups, stage: SequenceStage) -> list[str | None]:
    """Per group, why it is bad (a context feature varies; more steps than max_steps with overflow: error), or None."""
    reasons: list[str | None] = [None] * len(groups.starts)
    sequence = stage.sequence
    if sequence.context and len(groups.order) > 1:
        inside = groups.neighbours_in_a_group()
        group_of = np.repeat(np.arange(len(groups.starts)), groups.sizes)[1:]
        for name in sequence.context:
            differs = inside & ~_context_neighbours_equal(groups.features.column(name), groups.order)
            for group in np.unique(group_of[differs]).tolist():
                if reasons[group] is None:
                    reasons[group] = _varying_context(groups, group, name, stage)
    if sequence.overflow == "error" and sequence.max_steps is not None:
        for group in np.flatnonzero(groups.sizes > sequence.max_steps).tolist():
            if reasons[group] is None:
                reasons[group] = (f"{_group_text(groups, group, stage)}: {int(groups.sizes[group])} steps, more than "
                                  f"sequence.max_steps={sequence.max_steps} (overflow: error; overflow: split or truncate "
                                  "keeps such groups)")
    return reasons


def _context_neighbours_equal(column: pa.ChunkedArray | pa.Array, order: np.ndarray) -> np.ndarray:
    """Whether each sorted row's context value is the next one's, compared as encoded (list features by their hash)."""
    ordered = column.take(pa.array(order))
    if not is_list(ordered.type):
        return _neighbours_equal(ordered, exact=True)
    digests = group_hashes(pa.table({"value": ordered}), ["value"])
    return (digests[1:] == digests[:-1]).all(axis=1)


def _varying_context(groups: _Groups, group: int, name: str, stage: SequenceStage) -> str:
    """The reason of a bad group: the context feature that varies, with two of its values."""
    values = groups.rows(group).column(name).to_pylist()
    other = next((value for value in values if repr(value) != repr(values[0])), values[-1])
    return (f"{_group_text(groups, group, stage)}: context feature {name!r} varies within the group "
            f"({_shown(values[0])} and {_shown(other)} among its {len(values)} rows); a sequence.context feature has one "
            "value per group (leave it out of context to make it a feature list)")


def _group_text(groups: _Groups, group: int, stage: SequenceStage) -> str:
    """``sequence group tailnum='N123A'``: the group's key as the config names it."""
    row = groups.features.take(pa.array(groups.order[int(groups.starts[group]):int(groups.starts[group]) + 1]))
    shown = ", ".join(f"{name}={_shown(row.column(name)[0].as_py())}" for name in stage.sequence.group_by)
    return f"sequence group {shown}"


def _shown(value: Any) -> str:
    if isinstance(value, bytes):
        return repr(value.decode("utf-8", "backslashreplace"))
    if isinstance(value, list):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    return repr(value)


def _bad_group_rows(groups: _Groups, reasons: list[str | None], stage: SequenceStage) -> list[BadRow]:
    """Every row of every bad group as a bad row (its file, line and the group's reason; raw: its converted values)."""
    bad = [group for group, reason in enumerate(reasons) if reason is not None]
    if not bad:
        return []
    if stage.action == "fail":
        group = bad[0]
        first = _row_of(groups, int(groups.starts[group]), reasons[group] or "", stage)
        raise BadRecordError(f"{first.describe()} (errors.on_bad_record is fail; set it to skip or dead_letter to keep going)")
    if stage.action != "dead_letter":
        return []
    rows = []
    for group in bad:
        start, size = int(groups.starts[group]), int(groups.sizes[group])
        texts = rows_as_json(groups.rows(group), range(size))
        for offset, text in enumerate(texts):
            rows.append(_row_of(groups, start + offset, reasons[group] or "", stage, text))
    return rows


def _row_of(groups: _Groups, position: int, reason: str, stage: SequenceStage, raw: str = "") -> BadRow:
    return BadRow(stage.input_paths[int(groups.files[position])], int(groups.lines[position]), reason, raw)


def _encode_kept(groups: _Groups, kept: np.ndarray, stage: SequenceStage, counts: SequenceCounts,
                 bad_rows: list[BadRow]) -> Sequences:
    """The kept groups cut by max_steps, encoded, keyed and counted."""
    sequence = stage.sequence
    kept_groups = np.flatnonzero(kept)
    starts, sizes, split = groups.starts[kept], groups.sizes[kept], groups.split[kept]
    limit = sequence.max_steps
    taken = np.minimum(sizes, limit) if limit is not None and sequence.overflow == "truncate" else sizes
    chunks = -(-sizes // limit) if limit is not None and sequence.overflow == "split" else np.ones(len(sizes), np.int64)
    first_taken = np.cumsum(taken) - taken
    positions = np.repeat(starts - first_taken, taken) + np.arange(int(taken.sum()), dtype=np.int64)
    first_chunk = np.cumsum(chunks) - chunks
    within = np.arange(int(chunks.sum()), dtype=np.int64) - np.repeat(first_chunk, chunks)
    lengths = np.repeat(taken, chunks) - within * (limit or 0)
    if limit is not None:
        lengths = np.minimum(lengths, limit)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    steps = groups.order[positions]  # the kept steps' rows of the bucket's table, in step order
    encoded = tuple(encode_sequence_chunks(groups.features, offsets, stage.context, stage.feature_lists, rows=steps))
    record_bytes = np.concatenate([np.diff(run.offsets) for run in encoded]) if encoded else np.zeros(0, np.int64)
    whole = (chunks == 1) & (taken == sizes) & ((sizes <= limit) if limit is not None else True)
    _check_group_bytes(groups, kept_groups[whole], record_bytes[first_chunk[whole]], stage)
    digests, crcs = _checksums(encoded)
    record_split = np.repeat(split, chunks)
    if stage.seed is not None:
        key = seeded_sort_keys(digests[:, 1], stage.seed)
    else:  # input order: the position of each SequenceExample's earliest row
        position = (groups.files[positions].astype(np.uint64) << np.uint64(ROW_NUMBER_BITS)) | groups.lines[positions].astype(
            np.uint64)
        key = np.minimum.reduceat(position, offsets[:-1]) if len(lengths) else np.zeros(0, np.uint64)
    counts = _kept_counts(counts, groups.features, steps, offsets, record_split, split, chunks, sizes - taken, stage)
    return Sequences(record_split.astype(np.uint16), key, encoded, crcs, bad_rows, counts)


def _checksums(encoded: tuple[EncodedExamples, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``record_checksums`` of every record of the encoder's runs, in order: (n, 2) digests and CRCs."""
    if not encoded:
        return np.zeros((0, 2), np.uint64), np.zeros(0, np.uint32)
    parts = [record_checksums(run.data, run.offsets) for run in encoded]
    return np.concatenate([digests for digests, _ in parts]), np.concatenate([crcs for _, crcs in parts])


def _validity(features: pa.Table, name: str, rows: np.ndarray) -> np.ndarray:
    """For each of ``rows`` of ``features``, whether column ``name`` has a value there."""
    column = features.column(name)
    if not column.null_count:
        return np.ones(len(rows), dtype=bool)
    return np.asarray(column.is_valid(), dtype=bool)[rows]


def _check_group_bytes(groups: _Groups, whole_groups: np.ndarray, record_bytes: np.ndarray, stage: SequenceStage) -> None:
    """A group kept whole (max_steps did not cut it) whose SequenceExample exceeds max_group_bytes fails the build."""
    limit = stage.sequence.max_group_bytes
    over = np.flatnonzero(record_bytes > limit)
    if len(over):
        worst = int(over[np.argmax(record_bytes[over])])
        group = int(whole_groups[worst])
        raise GroupTooLargeError(
            f"{_group_text(groups, group, stage)}: {int(groups.sizes[group]):,} rows, a SequenceExample of "
            f"{int(record_bytes[worst]):,} bytes, more than sequence.max_group_bytes={limit:,} (one bucket of groups is "
            "held in one worker's memory); set sequence.max_steps to cut such groups, or raise max_group_bytes"
        )


def _kept_counts(counts: SequenceCounts, features: pa.Table, steps: np.ndarray, offsets: np.ndarray, record_split: np.ndarray,
                 group_split: np.ndarray, chunks: np.ndarray, truncated: np.ndarray, stage: SequenceStage) -> SequenceCounts:
    """The counts of the kept SequenceExamples, whose steps are rows ``steps`` of ``features`` (bounded by ``offsets``)."""
    lengths = np.diff(offsets)
    splits = len(counts.examples)
    low, high = counts.min_steps.copy(), counts.max_steps.copy()
    np.minimum.at(low, record_split, lengths)
    np.maximum.at(high, record_split, lengths)
    step_split = np.repeat(record_split, lengths)
    context_present = np.zeros((splits, len(stage.context)), np.int64)
    for column, name in enumerate(stage.context):
        valid = _validity(features, name, steps[offsets[:-1]])
        context_present[:, column] = _per_split(record_split[valid], counts)
    steps_present = np.zeros((splits, len(stage.feature_lists)), np.int64)
    for column, name in enumerate(stage.feature_lists):
        valid = _validity(features, name, steps)
        steps_present[:, column] = _per_split(step_split[valid], counts)
    return dataclasses.replace(
        counts, examples=_per_split(record_split, counts), groups=_per_split(group_split, counts),
        steps=_per_split(record_split, counts, lengths), min_steps=low, max_steps=high,
        split_groups=_per_split(group_split[chunks > 1], counts), truncated_steps=_per_split(group_split, counts, truncated),
        context_present=context_present, steps_present=steps_present)


# ------------------------------------------------------------------------------------ Beam


class EncodeSequences(beam.DoFn):
    """One bucket's rows (grouped by the runner) to SequenceExamples keyed for the shuffle, in pieces.

    Side outputs: the rows of bad groups per input file (dead_letter), and the bucket's SequenceCounts.
    """

    def __init__(self, stage: SequenceStage, piece_bytes: int):
        self._stage = stage
        self._piece_bytes = piece_bytes
        self._file_index = {path: number for number, path in enumerate(stage.input_paths)}

    def process(self, element: tuple[int, Iterable[pa.RecordBatch | HeldRows]]) -> Iterator[Any]:
        _, values = element
        values = list(values)
        held = [value for value in values if isinstance(value, HeldRows)]
        made = _bucket_sequences(values, self._stage)
        del values
        release_rows(held)  # encoded: the bucket's rows are freed before its SequenceExamples go on
        if made.bad_rows:
            beam.metrics.Metrics.counter("tfrbeam", "bad_groups").inc(int(made.counts.bad_groups.sum()))
            by_file: dict[int, list[BadRow]] = {}
            for row in made.bad_rows:
                by_file.setdefault(self._file_index[row.path], []).append(row)
            for file_index, rows in sorted(by_file.items()):
                yield beam.pvalue.TaggedOutput(BAD_ROWS, (file_index, rows))
        yield from made.pieces(self._piece_bytes)
        yield beam.pvalue.TaggedOutput(STATS, made.counts)


def _bucket_sequences(values: list[pa.RecordBatch | HeldRows], stage: SequenceStage) -> Sequences:
    """One bucket's batches (or references to batches held here), as one table of one chunk, grouped and encoded.

    The batches are joined first (one copy of the bucket): a bucket comes as one batch per source
    batch, more the larger the build, and sorting and taking from that many chunks cost more per
    row (6x the time for 4x the rows, 3M -> 12M). Nothing here outlives the call but what it
    returns: the bucket's rows can be freed at once.
    """
    return sequences_of(_bucket_table(values), stage)


def _bucket_table(values: list[pa.RecordBatch | HeldRows]) -> pa.Table:
    """The bucket's rows as one table of one chunk (the batches read back from run files are freed on return)."""
    held = iter(held_batches([value for value in values if isinstance(value, HeldRows)]))
    batches = [next(held) if isinstance(value, HeldRows) else value for value in values]
    return pa.Table.from_batches(batches).combine_chunks()
