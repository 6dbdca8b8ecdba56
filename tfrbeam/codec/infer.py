"""The one inference of a TFRecord's features from its records: which features, of which kind, of which shape.

The records are decoded without a schema (``decode.examples_to_record_batch``: one ``list<kind>`` column per
feature, null where a record lacks it, ``list<null>`` where it has no kind set). ``FeatureSample`` counts, per
feature and kind, the records that hold it and the fewest and most values they hold, over one batch or many,
with no Python work per record. An ``InferredFeature`` says what the sample shows; each reader of it keeps its own
form: ``open_dataset`` a FixedLen/VarLen spec (``shape``), the build's TFRecord input an Arrow field
(``majority_kind``, ``one_value_each``, ``always_present``), ``tfrbeam inspect`` a ``tf.io.parse_example`` spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sized
from types import MappingProxyType

import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.codec.kinds import ARROW_TYPES

__all__ = ["FeatureSample", "InferredFeature", "KindCount", "infer_column", "infer_columns"]

_KIND_OF_VALUES = {arrow_type: kind for kind, arrow_type in ARROW_TYPES.items()}  # what the decoder gives each kind


@dataclasses.dataclass(frozen=True)
class KindCount:
    """The sampled records that hold a feature with one kind: how many, and the fewest and most values one holds."""

    records: int
    min_values: int
    max_values: int

    def merged(self, other: KindCount) -> KindCount:
        if not other.records or not self.records:  # a column whose rows all lack the feature still names its kind
            return self if self.records else other
        return KindCount(self.records + other.records, min(self.min_values, other.min_values),
                         max(self.max_values, other.max_values))


@dataclasses.dataclass(frozen=True)
class InferredFeature:
    """What a sample of ``sampled`` records shows of one feature: ``by_kind`` maps "int64", "float" or "bytes" (None:
    held with no kind set, so no values) to the records holding it so, in the order the kinds were first seen."""

    name: str
    sampled: int
    by_kind: Mapping[str | None, KindCount]

    @property
    def present(self) -> int:
        """Sampled records that hold the feature (with any kind, or none)."""
        return sum(count.records for count in self.by_kind.values())

    @property
    def always_present(self) -> bool:
        return self.present == self.sampled

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds seen, first seen first; none: no sampled record sets a kind (its type is unknown)."""
        return tuple(kind for kind in self.by_kind if kind is not None)

    @property
    def kind(self) -> str | None:
        """The one kind seen; None when there is none, or several (``kinds`` says which)."""
        return self.kinds[0] if len(self.kinds) == 1 else None

    @property
    def majority_kind(self) -> str | None:
        """The kind most sampled records hold (ties: the first seen); None when no record sets a kind."""
        return max(self.kinds, key=lambda kind: self.by_kind[kind].records, default=None)

    @property
    def min_values(self) -> int:
        """The fewest values a sampled record holding the feature holds (any kind)."""
        return min((count.min_values for count in self.by_kind.values()), default=0)

    @property
    def max_values(self) -> int:
        return max((count.max_values for count in self.by_kind.values()), default=0)

    @property
    def one_value_each(self) -> bool:
        """Whether every sampled record holding the majority kind holds exactly one value of it."""
        kind = self.majority_kind
        return kind is not None and self.by_kind[kind].min_values == self.by_kind[kind].max_values == 1

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The fixed shape every sampled record agrees on: () one value each, (n,) n > 0 each; None (variable
        length) when it is absent or empty somewhere, the counts differ, or it has no one kind.

        Always empty is variable-length too: a fixed shape (0,) says nothing a reader can use.
        """
        if self.kind is None or len(self.by_kind) != 1 or not self.always_present:
            return None
        count = self.by_kind[self.kind]
        if count.min_values != count.max_values or count.min_values == 0:
            return None
        return () if count.min_values == 1 else (count.min_values,)


class FeatureSample:
    """The features of decoded record batches, added one batch (or one set of columns) at a time."""

    def __init__(self) -> None:
        self.records = 0
        self._counts: dict[str, dict[str | None, KindCount]] = {}

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """A batch decoded without a schema: one ``list<kind>`` column per feature, a row per record."""
        self.add_columns(zip(batch.schema.names, batch.columns), batch.num_rows)

    def add_columns(self, columns: Iterable[tuple[str, pa.Array]], rows: int) -> None:
        """``(name, list column)`` pairs of ``rows`` rows each (a feature list's steps are rows too)."""
        self.records += rows
        for name, column in columns:
            held = len(column) - column.null_count
            count = KindCount(0, 0, 0)  # no row holds it: the column still names its kind
            if held:
                lengths = pc.min_max(column.value_lengths())
                count = KindCount(held, lengths["min"].as_py(), lengths["max"].as_py())
            self._add(name, _kind_of(column.type.value_type), count)

    def add_decoded(self, features: Mapping[str, tuple[str | None, Sized]]) -> None:
        """One record as ``example.decode_example(payload, kinds=True)`` gives it: name -> (kind, values).

        For a reader that already walks records one at a time (``tfrbeam inspect``); readers of many records
        decode them in batches (``add_batch``). One difference: a batch gives a record that holds a feature with no
        kind beside records holding it with one an empty list of that kind; here it counts under None."""
        self.records += 1
        for name, (kind, values) in features.items():
            self._add(name, kind, KindCount(1, len(values), len(values)))

    def _add(self, name: str, kind: str | None, count: KindCount) -> None:
        kinds = self._counts.setdefault(name, {})
        kinds[kind] = kinds[kind].merged(count) if kind in kinds else count

    def features(self) -> dict[str, InferredFeature]:
        """Every feature seen, first seen first, as the sample so far shows it."""
        return {name: InferredFeature(name, self.records, MappingProxyType(dict(kinds)))
                for name, kinds in self._counts.items()}


def infer_columns(columns: Iterable[tuple[str, pa.Array]], rows: int) -> dict[str, InferredFeature]:
    """The features one decoded batch's columns show (``FeatureSample`` for one batch)."""
    sample = FeatureSample()
    sample.add_columns(columns, rows)
    return sample.features()


def infer_column(name: str, column: pa.Array) -> InferredFeature:
    """What one decoded column shows, each row a record, or a step of a feature list (whose steps are its own rows)."""
    return infer_columns([(name, column)], len(column))[name]


def _kind_of(value_type: pa.DataType) -> str | None:
    """The kind of a decoded column's values; None for ``null`` (no record set a kind)."""
    if pa.types.is_null(value_type):
        return None
    return _KIND_OF_VALUES[value_type]
