"""``open_dataset`` and ``Dataset``: batches of a TFRecord dataset, interleaved, shuffled, prefetched, resumable.

One epoch (``epoch.py``), in order: the dataset's segments (files, or record ranges of files) are shuffled with
a generator seeded by (seed, epoch); slot ``s`` of the interleave reads segments ``s, s + C,
s + 2C, ...`` of that order in blocks of ``block_length`` records; the consumer takes one block
from each live slot in turn, pushes it into the shuffle buffer (or a FIFO), and cuts batches.
Every choice is a function of (seed, epoch) and the record counts, never of timing, so a
position (epoch, batches delivered) can be replayed exactly: resuming fast-forwards through the
epoch reading record headers only, then decodes just the records the buffer held.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import secrets
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from tfrbeam.base.object_store import input_size
from tfrbeam.codec.decode import DEFAULT_MAX_FEATURES
from tfrbeam.dataset.columns import Block
from tfrbeam.dataset.epoch import EpochRun, EpochSettings, record_range_shard
from tfrbeam.dataset.options import Options
from tfrbeam.dataset.passes import PassIterator, PassSettings, Position
from tfrbeam.dataset.reader import RAW_KEY, BlockDecoder, Segment, count_records
from tfrbeam.dataset.spec import FixedLenFeature, PathSpec, Source, VarLenFeature, is_sequence_feature, resolve_source
from tfrbeam.dataset.workers import ProcessWorkers, ReadPlan, ThreadWorkers
from tfrbeam.errors import ConfigError
from tfrbeam.tfrecord.records import SkippedRegion

_LOG = logging.getLogger(__name__)

STATE_VERSION = 1
DEFAULT_CYCLE_LENGTH = 8
DEFAULT_BLOCK_LENGTH = 8192  # records per decode call: ~7 % less CPU per record than 4096 on the benchmark table
AUTO_PROCESSES_BYTES = 64 << 20


def open_dataset(
    path_or_pattern: PathSpec,
    split: str | None = None,
    *,
    columns: Sequence[str] | None = None,
    batch_size: int = 1024,
    output: Literal["numpy", "arrow"] = "numpy",
    num_parallel_reads: int | None = None,
    shuffle_files: bool = False,
    shuffle_buffer: int = 0,
    seed: int | None = None,
    prefetch: int | None = None,
    autotune: bool = True,
    deterministic: bool = True,
    skip_corrupt: bool = False,
    padded: bool | Mapping[str, int | None] | Sequence[str] = False,
    pad_value: Any = None,
    return_mask: bool = False,
    drop_remainder: bool = False,
    feature_spec: Mapping[str, Any] | None = None,
    compression: str | None = "auto",
    executor: Literal["auto", "threads", "processes"] = "auto",
    num_workers: int | None = None,
    block_length: int = DEFAULT_BLOCK_LENGTH,
    raw: bool = False,
    max_features: int | None = DEFAULT_MAX_FEATURES,
    record_type: Literal["Example", "SequenceExample"] | None = None,
) -> Dataset:
    """Open a TFRecord dataset of tf.train.Examples (or SequenceExamples) for training: a ``tfrbeam build`` directory or a glob.

    - ``path_or_pattern``: a build directory (its manifest ``tfrbeam_dataset.json`` gives splits, shards,
      record counts and the feature spec; ``split`` picks one, or slices and sums them as TFDS's
      split strings do: ``"train[:10%]+eval"``, ``tfrbeam.even_splits``), or a glob / file / list of files.
    - ``feature_spec``: {name: FixedLenFeature | VarLenFeature | manifest-style dict}; default:
      the manifest's, else inferred from the first 1000 records. ``columns`` decodes only those.
    - Batches: ``batch_size`` records (the last one of an epoch smaller unless ``drop_remainder``),
      as ``{name: numpy array | Ragged}`` (``output="numpy"``; ``padded`` pads variable-length
      features: True, a list of names, or {name: length}) or ``pyarrow.RecordBatch`` (``"arrow"``).
      Padding fills with ``pad_value`` (one value, or {name: value}; default 0, ``b""`` for bytes),
      and ``return_mask=True`` adds ``{name}__mask``, a bool array ``[B, T]`` that is True where a
      value was read, so a padded 0 is never mistaken for a real 0. A scalar some records omit
      (``VarLenFeature(dtype, scalar=True)``, the manifest's shape [] not always present) pads to
      ``[B]``, its mask ``[B]`` (``{name: n}`` keeps ``[B, n]``).
    - Order: ``num_parallel_reads`` files interleaved (default 8), ``block_length`` records from
      each in turn, ``shuffle_files`` and a ``shuffle_buffer`` of records, all seeded by ``seed``
      (random if None, but recorded in ``state_dict``). ``deterministic=False`` takes blocks in
      the order workers finish them (not resumable).
    - Work: ``executor`` "threads" or "processes" ("auto": processes for data over 64 MiB, threads for ``raw``),
      ``num_workers`` (default: CPU count), ``prefetch`` batches ahead (default 2), ``autotune``.
    - ``skip_corrupt`` skips damaged records (see ``Dataset.skipped``) instead of raising;
      ``raw=True`` yields each record's bytes as feature "record" (any payload, not just Examples).
    - ``max_features``: a record with more features raises ``RecordLimitError`` naming it (every
      feature is a column of its own; None: no limit).
    - ``record_type``: "Example" or "SequenceExample"; a build directory's manifest says which (so
      leave it out), a glob is read as Examples unless told. Reading one as the other fails
      naming the file and offset. A SequenceExample's context features come out as Example
      features do; each feature list as ``Ragged`` over steps (values ``[steps, *shape]``, or a
      ``Ragged`` of values when steps vary in length), padded to ``[B, T, ...]`` with
      ``{name}__steps`` (steps kept per record) when asked (``padded`` covers feature lists too).
    """
    if raw:
        feature_spec = {RAW_KEY: FixedLenFeature((), "bytes")}
    source = resolve_source(path_or_pattern, split, feature_spec, compression, skip_corrupt, max_features,
                            None if raw else record_type)
    features = _select(source.features, columns)
    padding = _padding(padded, features)
    pad_values = _pad_values(pad_value, padding)
    if return_mask and not padding:
        raise ConfigError("return_mask=True marks padded positions: pass padded= too")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    if output not in ("numpy", "arrow"):
        raise ConfigError(f"output={output!r} is not one of 'numpy', 'arrow'")
    if executor not in ("auto", "threads", "processes"):
        raise ConfigError(f"executor={executor!r} is not one of 'auto', 'threads', 'processes'")
    if shuffle_buffer < 0 or block_length < 1:
        raise ConfigError(f"shuffle_buffer must be >= 0 and block_length >= 1 (got {shuffle_buffer}, {block_length})")
    cpus = os.cpu_count() or 1
    workers = num_workers or (cpus if autotune or num_parallel_reads is None else min(cpus, num_parallel_reads))
    options = Options(
        batch_size=batch_size,
        output=output,
        cycle_length=num_parallel_reads or DEFAULT_CYCLE_LENGTH,
        block_length=block_length,
        shuffle_files=shuffle_files,
        shuffle_buffer=shuffle_buffer,
        seed=secrets.randbits(63) if seed is None else int(seed),
        drop_remainder=drop_remainder,
        prefetch=prefetch if prefetch is not None else 2,
        autotune=autotune,
        deterministic=deterministic,
        skip_corrupt=skip_corrupt,
        padded=padding,
        pad_values=pad_values,
        return_mask=return_mask,
        executor=executor,
        num_workers=max(1, workers),
        raw=raw,
        max_features=max_features,
    )
    segments, counts = _segments(source)
    return Dataset(source, features, options, segments, counts)


def _segments(source: Source) -> tuple[tuple[Segment, ...], tuple[int | None, ...]]:
    """The segments to read and their record counts: whole files, or a split string's record ranges of them."""
    segments = tuple(
        Segment(shard.path, shard.compression, expected_records=shard.num_records, expected_bytes=shard.num_bytes,
                generation=source.generation)
        for shard in source.files
    )
    if source.ranges is None:
        return segments, tuple(shard.num_records for shard in source.files)
    # A range that reaches its file's end stays open-ended, as a whole file is: the read checks the file's count there.
    sliced = tuple(
        dataclasses.replace(segment, start=start, stop=None if stop == segment.expected_records else stop)
        for segment, (start, stop) in zip(segments, source.ranges)
    )
    return sliced, tuple(stop - start for start, stop in source.ranges)


def _select(features: Mapping[str, Any], columns: Sequence[str] | None) -> dict[str, Any]:
    if columns is None:
        return dict(features)
    missing = [name for name in columns if name not in features]
    if missing:
        raise ConfigError(f"columns {missing} are not features of this dataset; it has {sorted(features)}")
    return {name: features[name] for name in columns}


def _pad_values(pad_value: Any, padding: Mapping[str, int | None]) -> dict[str, Any]:
    """The fill value of each padded feature: one value for all, or {name: value} (others get the default)."""
    if pad_value is None:
        return {}
    if isinstance(pad_value, Mapping):
        unknown = sorted(set(pad_value) - set(padding))
        if unknown:
            raise ConfigError(f"pad_value names {unknown} that are not padded features; those are {sorted(padding)}")
        return dict(pad_value)
    return dict.fromkeys(padding, pad_value)


def _padding(padded: bool | Mapping[str, int | None] | Sequence[str], features: Mapping[str, Any]) -> dict[str, int | None]:
    varlen = [name for name, feature in features.items() if isinstance(feature, VarLenFeature) or is_sequence_feature(feature)]
    if padded is True:
        return dict.fromkeys(varlen)
    if not padded:
        return {}
    chosen = dict(padded) if isinstance(padded, Mapping) else dict.fromkeys(padded)
    wrong = [name for name in chosen if name not in varlen]
    if wrong:
        raise ConfigError(f"padded names {wrong} that are not variable-length features being read; those are {varlen}")
    return chosen


class Dataset:
    """Batches of a TFRecord dataset; iterate it for one pass (``repeat`` epochs, at most ``take`` batches).

    Iterating again continues with the next epoch (a new shuffle). ``state_dict()`` is the
    position after the last batch handed out; ``load_state_dict`` makes the next iteration
    continue from such a position, exactly.
    """

    def __init__(
        self,
        source: Source,
        features: Mapping[str, Any],
        options: Options,
        segments: tuple[Segment, ...],
        counts: tuple[int | None, ...],
        shard_key: tuple = (),
        epochs: int | None = 1,
        limit: int | None = None,
    ):
        self.source = source
        self.features = dict(features)
        self.options = options
        self.segments = segments
        self._counts = counts
        self._shard_key = shard_key
        self._epochs = epochs
        self._limit = limit
        self._position = Position()
        self._iterator: weakref.ref | None = None
        self._workers: ThreadWorkers | ProcessWorkers | None = None
        self.skipped: list[SkippedRegion] = []
        self.stats: dict[str, Any] = {"workers": options.num_workers, "prefetch": options.prefetch, "executor": None}

    def __repr__(self) -> str:
        records = "unknown" if self.num_records is None else f"{self.num_records:,}"
        return (
            f"Dataset({len(self.segments)} segments, {records} records, batch_size={self.options.batch_size}, "
            f"features={list(self.features)}, shuffle_files={self.options.shuffle_files}, "
            f"shuffle_buffer={self.options.shuffle_buffer}, seed={self.options.seed})"
        )

    # ------------------------------------------------------------------ derived datasets

    def _derive(self, **changes: Any) -> Dataset:
        fields: dict[str, Any] = {
            "source": self.source, "features": self.features, "options": self.options, "segments": self.segments,
            "counts": self._counts, "shard_key": self._shard_key, "epochs": self._epochs, "limit": self._limit,
        }
        fields.update(changes)
        return Dataset(**fields)

    def shard(self, num_workers: int, index: int, by: Literal["auto", "file", "record"] = "auto") -> Dataset:
        """This worker's part of the data: the union over ``index`` is the whole, with no overlap.

        By file (every ``num_workers``-th segment) when there are at least as many files as workers,
        else by contiguous record ranges (seeking with the read index where one exists).
        """
        if not 0 <= index < num_workers:
            raise ConfigError(f"shard index {index} is not in [0, {num_workers})")
        mode = by if by != "auto" else ("file" if len(self.segments) >= num_workers else "record")
        if mode == "file":
            picked = range(index, len(self.segments), num_workers)
            return self._derive(
                segments=tuple(self.segments[i] for i in picked), counts=tuple(self._counts[i] for i in picked),
                shard_key=self._shard_key + (("file", num_workers, index),),
            )
        if mode != "record":
            raise ConfigError(f"shard by={by!r} is not one of 'auto', 'file', 'record'")
        segments, counts = record_range_shard(self.segments, self._segment_counts(), num_workers, index)
        return self._derive(segments=segments, counts=counts, shard_key=self._shard_key + (("record", num_workers, index),))

    def repeat(self, count: int | None = None) -> Dataset:
        """Each pass reads ``count`` epochs (None: forever), each with its own shuffle."""
        if count is not None and count < 0:
            raise ConfigError(f"repeat count must be >= 0 or None, got {count}")
        return self._derive(epochs=count)

    def take(self, count: int) -> Dataset:
        """Each pass stops after ``count`` batches."""
        if count < 0:
            raise ConfigError(f"take count must be >= 0, got {count}")
        return self._derive(limit=count)

    def _segment_counts(self) -> list[int]:
        counts = []
        for segment, count in zip(self.segments, self._counts):
            if count is None:
                total = count_records(segment.path, segment.compression)
                end = total if segment.stop is None else min(segment.stop, total)
                count = max(end - segment.start, 0)
            counts.append(count)
        return counts

    # ------------------------------------------------------------------ sizes

    @property
    def num_records(self) -> int | None:
        """Records per epoch when known (from the manifest, a shard's record range or a count)."""
        if any(count is None for count in self._counts):
            return None
        return sum(self._counts)  # type: ignore[arg-type]

    def batches_per_epoch(self) -> int | None:
        records = self.num_records
        if records is None:
            return None
        size = self.options.batch_size
        return records // size if self.options.drop_remainder else math.ceil(records / size)

    def __len__(self) -> int:
        per_epoch = self.batches_per_epoch()
        if per_epoch is None:
            raise TypeError("the number of batches is unknown: the files' record counts are not in a manifest")
        if self._epochs is None:
            if self._limit is None:
                raise TypeError("the dataset repeats forever")
            return self._limit
        total = per_epoch * self._epochs
        return total if self._limit is None else min(total, self._limit)

    # ------------------------------------------------------------------ position

    @functools.cached_property
    def _fingerprint_digest(self) -> str:
        """Computed once: the segments, sizes and options are fixed when the dataset is opened."""
        return self._fingerprint()

    def _fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self._described, sort_keys=True, default=str).encode()).hexdigest()

    @functools.cached_property
    def _described(self) -> dict[str, Any]:
        return self._description()

    def _description(self) -> dict[str, Any]:
        """What a saved position depends on, by the argument it comes from."""
        options = {name: getattr(self.options, name) for name in Options.order_fields + ("raw",)}
        return {
            # Names and sizes, not full paths: a dataset copied elsewhere (say to a local disk) still resumes.
            "files": [
                (os.path.basename(segment.path), _size(segment.path), segment.start, segment.stop) for segment in self.segments
            ],
            "columns": sorted(self.features),
            **options,
            "num_parallel_reads": min(self.options.cycle_length, max(len(self.segments), 1)),
            "shard": self._shard_key,
        }

    @functools.cached_property
    def _described_digests(self) -> dict[str, str]:
        return {key: hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
                for key, value in self._described.items()}

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch delivered: pass it to ``load_state_dict`` to continue there."""
        if not self.options.deterministic:
            raise ConfigError(
                "state_dict() needs deterministic=True: with deterministic=False the order depends on timing "
                "and cannot be replayed"
            )
        fingerprint = self._fingerprint_digest  # reads every shard's size once, outside the position's lock
        return {"version": STATE_VERSION, "fingerprint": fingerprint, "seed": self.options.seed,
                "arguments": self._described_digests, **self._position.snapshot()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a position saved by ``state_dict`` (same files, seed and order options)."""
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"dataset state version {state.get('version')!r} is not {STATE_VERSION}")
        if state.get("fingerprint") != self._fingerprint_digest or state.get("seed") != self.options.seed:
            saved, ours = state.get("arguments") or {}, self._described_digests
            differing = [key for key in ours if saved.get(key) != ours[key]]
            if state.get("seed") != self.options.seed and "seed" not in differing:
                differing.insert(0, "seed")
            named = ", ".join(differing) if saved else "files, shard, seed or order options"
            raise ConfigError(
                f"this dataset state was saved by a dataset with other {named} (saved seed {state.get('seed')}, this "
                f"dataset's {self.options.seed}); open the dataset with the same arguments to resume"
            )
        self._position.restore(state)

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Any]:
        self._position.begin_pass()
        previous = self._iterator() if self._iterator is not None else None
        if previous is not None:
            previous.close()  # one pass at a time: the workers serve a single consumer
        iterator = PassIterator(self._pass_settings(), self._position)
        self._iterator = weakref.ref(iterator)
        return iterator

    def close(self) -> None:
        """Stop the current pass and the reader workers (processes are reused between epochs until then)."""
        previous = self._iterator() if self._iterator is not None else None
        if previous is not None:
            previous.close()
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __del__(self) -> None:
        # A finaliser must not raise (Python would only print it, at an arbitrary moment); the
        # failure to clean up is logged instead. close() is the way to see such errors.
        try:
            self.close()
        except Exception:
            _LOG.warning("closing a dataset that was never closed failed", exc_info=True)

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _executor(self) -> str:
        if self.options.executor != "auto":
            return self.options.executor
        if self.options.raw:
            # Nothing to decode: processes would add only their start-up (~1 s each) and a copy of every
            # record through a pipe (object store benchmark, raw epoch: 3.2 s on processes, 1.0 s on threads).
            return "threads"
        # Measured on the 1M-record table (see the README): processes win once there is enough data
        # to pay for their start-up (~1 s); they need POSIX file descriptor passing.
        big = _total_bytes(self.segments) > AUTO_PROCESSES_BYTES
        return "processes" if os.name == "posix" and self.options.num_workers > 1 and big else "threads"

    def _get_workers(self) -> ThreadWorkers | ProcessWorkers:
        if self._workers is None:
            plan = self._plan()
            kind = self._executor()
            count = min(self.options.num_workers, self._cycle())
            readahead = 4  # blocks a worker may decode ahead of the consumer, per worker
            self._workers = (ProcessWorkers if kind == "processes" else ThreadWorkers)(plan, count, readahead)
            self.stats["executor"] = kind
            self.stats["workers"] = count
            _LOG.info(
                "reading %d segments with %d worker %s, %d files interleaved", len(self.segments), count, kind, self._cycle()
            )
        return self._workers

    def _plan(self) -> ReadPlan:
        decoder = BlockDecoder(self.features, raw=self.options.raw, max_features=self.options.max_features,
                               record_type=self.source.record_type)
        return ReadPlan(self.segments, decoder, self.options.block_length, self.options.skip_corrupt)

    def _cycle(self) -> int:
        return max(1, min(self.options.cycle_length, len(self.segments)))

    def _live_workers(self) -> ThreadWorkers | ProcessWorkers | None:
        """The reader workers if started (autotune adjusts them), else None."""
        return self._workers

    def _pass_settings(self) -> PassSettings:
        """What a pass needs from this dataset, handed to it explicitly."""
        return PassSettings(
            features=self.features, options=self.options, epochs=self._epochs, limit=self._limit, empty=not self.segments,
            epoch_batches=self._epoch_batches, workers=self._live_workers, stats=self.stats,
        )

    def _epoch_batches(self, epoch: int, skip: int = 0, cancel: threading.Event | None = None) -> Iterator[Block]:
        """The batches (with their record ids under ``__id__``) of epoch ``epoch``, from batch ``skip`` on."""
        if not self.segments:
            return
        run = EpochRun(EpochSettings(self._plan(), self.options, self._cycle()), epoch, self.skipped)
        if skip:
            run.fast_forward(skip)
        batches = run.run(self._get_workers(), cancel)
        try:
            yield from batches
        finally:
            batches.close()


def _size(path: str) -> int | None:
    try:
        return input_size(path)
    except OSError:
        return None


def _total_bytes(segments: Sequence[Segment]) -> int:
    """Bytes on disk of the dataset's files (a file that cannot be sized counts 0: reading it reports why)."""
    return sum(_size(path) or 0 for path in {segment.path for segment in segments})
