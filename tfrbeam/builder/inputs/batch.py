"""The element the readers give: SourceBatch (rows of one file with their lines and raw text), its coder
and its conversion to feature columns."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tfrbeam.builder.features.convert import BadRow, ConvertedBatch, FeatureSpec, convert_batch, rows_as_json
from tfrbeam.builder.features.file_contents import FileBatchTooLarge

__all__ = ["FILE_SLICE_BYTES", "FIRST_SLICE_ROWS", "MAX_SLICE_ROWS", "SourceBatch", "SourceBatchCoder",
           "convert_in_slices", "convert_source_batch", "empty_batch", "strip_line_break"]

# A batch of paths (from_file features) is converted in slices whose files hold about this many bytes.
FILE_SLICE_BYTES = 64 << 20
FIRST_SLICE_ROWS = 16  # then at most twice the rows of the slice before
MAX_SLICE_ROWS = 4096


@dataclass(frozen=True, eq=False)
class SourceBatch:
    """Rows of one input file with their provenance.

    lines: per row, the 1-based physical line it starts on (CSV) or its 1-based row number in
    the file (Parquet). bad_rows: rows the reader itself rejected (CSV: wrong number of fields).
    For CSV, raw holds the UTF-8 text of the batch's lines, starting at line raw_first_line, with
    raw_line_starts the offset of each of those lines in raw (plus the end), and spans the number
    of physical lines of each row; raw_text() slices a row's exact text from them. converted holds
    the batch's feature columns when ReadTabular converted it as it read (``convert_with``).
    records and file_rows are what the reader's counts are checked against (see ``inputs.read.rows_checked``).
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
    # Rows in = rows out (docs/build-config.md#rows-in-rows-out): the records a text parser found behind this batch
    # (CSV: pyarrow's records, JSON lines: non-blank lines), which its rows and bad rows must add up to; and the rows
    # the whole file announces (a footer, block counts, an index, a table's num_rows), for the commit's check.
    records: int | None = None
    file_rows: int | None = None

    @property
    def first_line(self) -> int:
        return int(self.lines[0]) if len(self.lines) else 0

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    def rows(self, start: int, stop: int) -> SourceBatch:
        """Rows start to stop of the batch (the reader's own bad rows go with the slice that starts at 0)."""
        if start == 0 and stop >= self.num_rows:
            return self
        length = max(0, min(stop, self.num_rows) - start)
        null_text = {name: text.slice(start, length) for name, text in self.null_text.items()} if self.null_text else None
        return replace(self, lines=self.lines[start:start + length], batch=self.batch.slice(start, length),
                       bad_rows=self.bad_rows if start == 0 else (), converted=None, null_text=null_text,
                       spans=self.spans[start:start + length] if self.spans is not None else None)

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


def convert_in_slices(source: SourceBatch, specs: Sequence[FeatureSpec]) -> Iterator[SourceBatch]:
    """The batch with ``converted`` set; with from_file features, in slices of rows whose files hold about
    FILE_SLICE_BYTES (sized by the files read so far; a slice above BATCH_FILE_BYTES is halved), so a batch of
    many paths never holds all its files at once."""
    files = [spec.name for spec in specs if spec.file is not None and spec.file.part == "bytes"]
    if not files or source.num_rows <= 1:
        yield replace(source, converted=convert_source_batch(source, specs))
        return
    start, rows = 0, FIRST_SLICE_ROWS
    while start < source.num_rows:
        piece = source.rows(start, start + rows)
        try:
            converted = convert_source_batch(piece, specs)
        except FileBatchTooLarge:
            rows = max(1, rows // 2)
            continue
        yield replace(piece, converted=converted)
        start += piece.num_rows
        held = sum(int(pc.sum(pc.binary_length(converted.batch.column(name))).as_py() or 0) for name in files)
        per_row = max(held / max(converted.batch.num_rows, 1), 1.0)
        rows = max(1, min(int(FILE_SLICE_BYTES / per_row), 2 * rows, MAX_SLICE_ROWS))


def strip_line_break(chunk: bytes) -> bytes:
    if chunk.endswith(b"\r\n"):
        return chunk[:-2]
    if chunk.endswith((b"\n", b"\r")):
        return chunk[:-1]
    return chunk


def empty_batch(names: Sequence[str]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], pa.binary()) for _ in names], names=list(names))
