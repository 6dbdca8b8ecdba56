"""The element the readers give: SourceBatch (rows of one file with their lines and raw text), its coder
and its conversion to feature columns."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa

from tfrbeam.build.features import BadRow, ConvertedBatch, FeatureSpec, convert_batch, rows_as_json

__all__ = ["SourceBatch", "SourceBatchCoder", "convert_source_batch", "empty_batch", "strip_line_break"]


@dataclass(frozen=True, eq=False)
class SourceBatch:
    """Rows of one input file with their provenance.

    lines: per row, the 1-based physical line it starts on (CSV) or its 1-based row number in
    the file (Parquet). bad_rows: rows the reader itself rejected (CSV: wrong number of fields).
    For CSV, raw holds the UTF-8 text of the batch's lines, starting at line raw_first_line, with
    raw_line_starts the offset of each of those lines in raw (plus the end), and spans the number
    of physical lines of each row; raw_text() slices a row's exact text from them. converted holds
    the batch's feature columns when ReadTabular converted it as it read (``convert_with``).
    """

    path: str
    lines: np.ndarray
    batch: pa.RecordBatch
    bad_rows: tuple[BadRow, ...] = ()
    raw: bytes | None = None
    raw_first_line: int = 0
    raw_line_starts: np.ndarray | None = None
    spans: np.ndarray | None = None
    true_values: tuple[str, ...] = ()  # the CSV dialect's boolean tokens, for the conversion
    false_values: tuple[str, ...] = ()
    converted: ConvertedBatch | None = None
    null_text: dict[str, pa.Array] | None = None  # per column with nulls: each null cell's token (per-feature nulls)
    null_values: tuple[str, ...] = ()  # the file-wide null tokens, when null_text is set

    @property
    def first_line(self) -> int:
        return int(self.lines[0]) if len(self.lines) else 0

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    def raw_text(self, rows: Iterable[int]) -> list[str]:
        """The raw text of the given rows: the CSV lines as in the file, or the Parquet row as JSON."""
        if self.raw is None:
            return rows_as_json(self.batch, rows)
        assert self.raw_line_starts is not None and self.spans is not None  # CSV batches carry them with raw
        texts = []
        for row in rows:
            first = int(self.lines[row]) - self.raw_first_line
            last = first + int(self.spans[row])
            chunk = self.raw[self.raw_line_starts[first]:self.raw_line_starts[last]]
            texts.append(strip_line_break(chunk).decode("utf-8", "replace"))
        return texts


class SourceBatchCoder(beam.coders.Coder):
    """Pickles a SourceBatch, but sizes it from its buffers: Beam's element counters would
    otherwise pickle a sample of the batches (~9 MB each) just to measure them."""

    def encode(self, value: SourceBatch) -> bytes:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> SourceBatch:
        return pickle.loads(encoded)

    def estimate_size(self, value: SourceBatch) -> int:
        arrays = (value.lines, value.raw_line_starts, value.spans)
        return (value.batch.get_total_buffer_size() + len(value.raw or b"") + len(value.path)
                + sum(array.nbytes for array in arrays if array is not None))

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return SourceBatch


beam.coders.registry.register_coder(SourceBatch, SourceBatchCoder)


def convert_source_batch(source: SourceBatch, specs: Sequence[FeatureSpec]) -> ConvertedBatch:
    """convert_batch on a SourceBatch; the reader's own bad rows come first in the result's bad_rows."""
    converted = convert_batch(source.batch, specs, source, source.true_values, source.false_values,
                              source.null_text, source.null_values)
    if source.bad_rows:
        return ConvertedBatch(batch=converted.batch, bad_rows=list(source.bad_rows) + converted.bad_rows,
                              kept_rows=converted.kept_rows)
    return converted


def strip_line_break(chunk: bytes) -> bytes:
    if chunk.endswith(b"\r\n"):
        return chunk[:-2]
    if chunk.endswith((b"\n", b"\r")):
        return chunk[:-1]
    return chunk


def empty_batch(names: Sequence[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], pa.binary()) for _ in names], names=list(names))
