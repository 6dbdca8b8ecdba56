"""Splits from the data (``splits: {column: ...}`` or ``splits: {train: GLOB, ...}``), beside the default hash fractions.

A split column names each row's split (as AutoML Tables and TFRecorder do): its value, mapped by
``splits.map`` (or itself a split name), picks the split, and a null or unknown value makes a bad
row. File-pattern splits (TFX's input splits) put every row of a file in the split whose glob
lists it. Either way the rest of the build (seeded shuffle, shards, manifest, commit) is the one
the hash splits use; only the split index of each row comes from here.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.builder.config import BuildConfig, SplitColumn, SplitFiles
from tfrbeam.builder.features.convert import BadRow, ConvertedBatch, Provenance
from tfrbeam.builder.inputs.files import InputFile, list_inputs
from tfrbeam.errors import ConfigError

__all__ = ["ColumnSplits", "describe_split_source", "list_split_inputs", "split_column_problem"]

_SHOWN_VALUES = 10


def split_column_problem(split_by: SplitColumn, schema: pa.Schema, columns: tuple[str, ...] | None,
                         where: str) -> str | None:
    """What is wrong with the split column against the input's schema (None: nothing)."""
    name = split_by.column
    if columns is not None and name not in columns:
        return f"{name!r} is left out of input.columns (the split column is read to split the rows; add it)"
    if name not in schema.names:
        return f"column {name!r} is not in {where} (columns: {', '.join(schema.names)})"
    arrow_type = schema.field(name).type
    value_type = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if not _textual(value_type):
        return (f"column {name!r} is {value_type}; a split column holds strings, integers or booleans (a row's split "
                "name, or a value splits.map maps to one)")
    return None


def _textual(arrow_type: pa.DataType) -> bool:
    return any(check(arrow_type) for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                               pa.types.is_large_binary, pa.types.is_integer, pa.types.is_boolean))


def _as_binary(column: pa.Array) -> pa.Array:
    """The column's values as the bytes of their text: integers as digits, booleans as true/false."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_integer(column.type) or pa.types.is_boolean(column.type):
        column = column.cast(pa.string())
    return column.cast(pa.binary())


class ColumnSplits:
    """Each row's split from the split column; rows whose value is null or not a known value become bad rows."""

    def __init__(self, split_by: SplitColumn, names: tuple[str, ...]):
        pairs = split_by.values or tuple((name, name) for name in names)
        self.column = split_by.column
        self._keys = pa.array([value.encode("utf-8") for value, _ in pairs], pa.binary())
        self._split_of_key = np.array([names.index(split) for _, split in pairs], dtype=np.uint16)
        self._allowed = ", ".join(value for value, _ in pairs[:_SHOWN_VALUES]) + (", ..." if len(pairs) > _SHOWN_VALUES
                                                                                   else "")
        self._of = "a key of splits.map" if split_by.values else "a split of splits.names"

    def assign(self, source: Provenance, raw: pa.RecordBatch, converted: ConvertedBatch
               ) -> tuple[ConvertedBatch, np.ndarray]:
        """The converted rows whose split is known, with the others moved to the bad rows, and each kept row's split."""
        values = _as_binary(raw.column(self.column).take(pa.array(converted.kept_rows, pa.int64())))
        found = pc.index_in(values, value_set=self._keys)
        known = np.asarray(found.is_valid(), dtype=bool)
        if known.all():
            return converted, self._split_of_key[np.asarray(found, dtype=np.int64)]
        rows = np.flatnonzero(~known)
        inputs = converted.kept_rows[rows]
        texts = source.raw_text(inputs.tolist())
        lines = np.asarray(source.lines)[inputs].tolist()
        bad = [BadRow(source.path, int(line), self._reason(value), text)
               for line, value, text in zip(lines, values.take(pa.array(rows)).to_pylist(), texts)]
        keep = np.flatnonzero(known)
        kept = ConvertedBatch(batch=converted.batch.take(pa.array(keep)), bad_rows=converted.bad_rows + bad,
                              kept_rows=converted.kept_rows[keep])
        return kept, self._split_of_key[np.asarray(found.filter(pa.array(known)), dtype=np.int64)]

    def _reason(self, value: bytes | None) -> str:
        if value is None:
            return f"split column {self.column!r} is null (every row needs a split; allowed: {self._allowed})"
        shown = value.decode("utf-8", "replace")
        return f"split column {self.column!r} holds {shown!r}, which is not {self._of} (allowed: {self._allowed})"


def list_split_inputs(split_by: SplitFiles) -> tuple[list[InputFile], tuple[int, ...]]:
    """Every file of the splits' globs, sorted by path, and the index of each one's split; each glob is listed once.

    Raises ConfigError naming the key when a glob matches no file or a file matches two globs.
    """
    split_of: dict[str, int] = {}
    files: dict[str, InputFile] = {}
    for index, (name, pattern) in enumerate(split_by.patterns):
        for item in list_inputs(pattern, key=f"splits.{name}"):
            if item.path in split_of:
                other = split_by.patterns[split_of[item.path]][0]
                raise ConfigError(f"splits.{name}: {item.path} is matched by splits.{other} too; a file belongs to "
                                  "one split (make the globs disjoint)")
            split_of[item.path] = index
            files[item.path] = item
    inputs = sorted(files.values(), key=lambda item: item.path)
    return inputs, tuple(split_of[item.path] for item in inputs)


def describe_split_source(config: BuildConfig, input_splits: tuple[int, ...] = ()) -> str:
    """How rows are assigned to splits, in one line (the dry run and the manifest's split_assignment)."""
    split_by = config.split_by
    if isinstance(split_by, SplitColumn):
        mapping = ", ".join(f"{value} -> {split}" for value, split in split_by.values)
        return (f"the value of column {split_by.column!r}"
                + (f" mapped by splits.map ({mapping})" if mapping else " as the split name")
                + "; a null or unknown value is a bad row")
    if isinstance(split_by, SplitFiles):
        counts = np.bincount(np.asarray(input_splits, dtype=np.int64), minlength=len(split_by.patterns))
        return "the input file: " + ", ".join(
            f"{name} from {pattern} ({int(count)} file{'s' if count != 1 else ''})"
            for (name, pattern), count in zip(split_by.patterns, counts))
    raise ValueError("hash splits are described by their fractions")
