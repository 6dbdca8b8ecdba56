"""The Beam side of reading: ReadTabular, the PTransform that lists, splits, spreads and reads a build's inputs
as SourceBatch elements (counting progress, converting as it reads)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import apache_beam as beam

from tfrbeam.builder.config.encodings import splittable_encoding
from tfrbeam.builder.config.schema import CsvOptions, InputConfig
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.builder.inputs.ahead import read_ahead
from tfrbeam.builder.inputs.avro import arrow_schema, avro_blocks, avro_schema, read_avro_blocks
from tfrbeam.builder.inputs.batch import SourceBatch, convert_in_slices
from tfrbeam.builder.inputs.csv import read_csv_file, read_csv_range
from tfrbeam.builder.inputs.csv_text import RangeScan, csv_data_offset, csv_ranges, scan_csv_range
from tfrbeam.builder.inputs.files import InputFile, is_compressed, openable
from tfrbeam.builder.inputs.jsonl import count_line_breaks, jsonl_schema, read_jsonl_file, read_jsonl_range
from tfrbeam.builder.inputs.orc import read_orc_stripes, stripe_listing_and_rows
from tfrbeam.builder.inputs.parquet import read_parquet_row_group, row_group_listing
from tfrbeam.builder.inputs.progress import ProgressCounter, progress_dir
from tfrbeam.builder.inputs.sample import input_files
from tfrbeam.builder.inputs.tfrecord import (
    file_compression,
    read_tfrecord_piece,
    shard_records,
    tfrecord_pieces_and_records,
    tfrecord_schema,
)
from tfrbeam.errors import RowCountError

__all__ = ["ReadTabular", "converted_ahead", "rows_checked"]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class _TypedPiece:
    """A run of a typed file's parts (ORC stripes; Avro blocks from a byte offset), and the rows its footer or block
    headers announce for it and for the whole file."""

    path: str
    first: int
    count: int
    rows_before: int
    bytes_per_row: float
    rows: int
    file_rows: int
    kind: str  # "stripe" (ORC: first is a stripe's number) or "block" (Avro: first is a block's byte offset)

    @property
    def described(self) -> str:
        if self.kind == "stripe":
            return f"stripes {self.first} to {self.first + self.count - 1} (the footer)"
        return f"{self.count} block(s) from byte {self.first} (their headers)"


@dataclass(frozen=True)
class _CsvPiece:
    path: str
    start: int
    end: int
    line_breaks_before: int
    whole: bool


def rows_checked(sources: Iterable[SourceBatch], path: str, piece: str, rows: int | None = None,
                 file_rows: int | None = None) -> Iterator[SourceBatch]:
    """The batches a reader gives for one piece of an input, checked at the boundary: rows in = rows out.

    Each batch's rows and bad rows add up to the records its parser found (``SourceBatch.records``:
    CSV, JSON lines), and the piece's add up to the rows its format ``rows`` announces (a Parquet
    row group's footer entry, ORC stripes, Avro block counts, a TFRecord index or manifest); else a
    RowCountError naming the input, which fails the build before anything is published. Every batch
    carries ``file_rows`` (the whole file's announced rows) to the commit, which checks the file.
    """
    given = 0
    for source in sources:
        rows_out = source.num_rows + len(source.bad_rows)
        if source.records is not None and rows_out != source.records:
            raise RowCountError(f"{source.path}: the parser found {source.records} rows from line {source.first_line} "
                                f"on, but its reader gave {rows_out} (rows and bad rows); nothing was published")
        given += rows_out
        yield replace(source, file_rows=file_rows) if file_rows is not None else source
    if rows is not None and given != rows:
        raise RowCountError(f"{path}: {piece} announces {rows} rows, but its reader gave {given} (rows and bad rows); "
                            "nothing was published")


def _rows_of_pieces(rows_before: Sequence[int], file_rows: int) -> list[int]:
    """Each piece's rows, from the rows before each piece (in file order) and the file's."""
    return [after - before for before, after in zip(rows_before, [*rows_before[1:], file_rows])]


def _counted(sources: Iterable[SourceBatch], counter: ProgressCounter | None,
             bytes_per_row: float | None = None) -> Iterator[SourceBatch]:
    for source in sources:
        if counter is not None:
            rows = source.num_rows + len(source.bad_rows)
            size = len(source.raw) if source.raw is not None else int(rows * (bytes_per_row or 0))
            counter.add(rows, size)
        yield source


def _row_groups_with_row_size(item: tuple[str, int], required: bool) -> list[tuple[str, int, int, float, int, int]]:
    """(path, row group, rows before it, file bytes per row, its rows, the file's rows) for each row group of a listed
    Parquet file, the rows as its footer announces them."""
    path, size = item
    groups, rows = row_group_listing(path, required)
    per_row = size / rows if rows else 0.0
    group_rows = _rows_of_pieces([before for _, before in groups], rows)
    return [(path, group, before, per_row, own, rows) for (group, before), own in zip(groups, group_rows)]


class ReadTabular(beam.PTransform):
    """Read the inputs of a build as SourceBatch elements (Parquet by row group, ORC by stripe, Avro by runs of sync
    blocks, CSV and JSON lines by range or whole file, TFRecord by record range or whole file).

    columns limits what is read (Parquet projection; CSV columns dropped after parsing); None
    means input_config.columns, and None there means every column. The input files are listed
    when the transform is built (see .inputs, for the manifest). progress_under (a run's local
    staging directory) makes the readers count rows and bytes read there, for the progress display.

    Relative local paths are opened from the directory the transform was built in, since workers
    (a worker pool, a cluster) may run elsewhere; batches and bad rows still name them as given.

    convert_with (feature specs) converts every batch as it is read, on a thread of its own
    (``SourceBatch.converted``): pyarrow's casts run without the GIL while the caller encodes the
    batch before.
    """

    def __init__(self, input_config: InputConfig, columns: Sequence[str] | None = None,
                 inputs: Sequence[InputFile] | None = None, progress_under: str | None = None,
                 convert_with: Sequence[FeatureSpec] | None = None):
        super().__init__()
        self.convert_with = tuple(convert_with) if convert_with is not None else None
        self.input_config = input_config
        self.columns = tuple(columns) if columns is not None else input_config.columns
        self.inputs = list(inputs) if inputs is not None else input_files(input_config)
        self.progress_dir = progress_dir(progress_under) if progress_under is not None else None
        self.opened_as = {item.path: openable(item.path) for item in self.inputs}

    def expand(self, pbegin):
        opened = self.opened_as
        files = pbegin | "ListFiles" >> beam.Create([(opened[f.path], f.size) for f in self.inputs], reshuffle=False)
        columns = self.columns
        counts = self.progress_dir
        specs = self.convert_with
        given = {where: path for path, where in opened.items() if where != path}
        if self.input_config.format in _TYPED_PIECES:
            pieces, read = _TYPED_PIECES[self.input_config.format](self)
            return (files
                    | "Pieces" >> beam.FlatMap(pieces)
                    | "SpreadPieces" >> beam.Reshuffle()
                    | "ReadPiece" >> beam.FlatMap(lambda piece: converted_ahead(_counted(rows_checked(
                        _as_given(read(piece), given), given.get(piece.path, piece.path), piece.described, piece.rows,
                        piece.file_rows), _counter(counts), piece.bytes_per_row), specs))
                    .with_output_types(SourceBatch))
        if self.input_config.format == "tfrecord":
            return _read_tfrecord(self, files, given, specs)
        if self.input_config.format == "parquet":
            required = self.input_config.parquet.require_checksums
            return (files
                    | "RowGroups" >> beam.FlatMap(_row_groups_with_row_size, required)
                    | "SpreadRowGroups" >> beam.Reshuffle()
                    | "ReadRowGroup" >> beam.FlatMap(lambda item: converted_ahead(_counted(rows_checked(
                        _as_given(read_parquet_row_group(item[0], item[1], item[2], columns=columns), given),
                        given.get(item[0], item[0]), f"row group {item[1]} (its footer entry)", item[4], item[5]),
                        _counter(counts), item[3]), specs))
                    .with_output_types(SourceBatch))
        options = self.input_config.csv
        split_bytes = self.input_config.split_bytes
        if self.input_config.format == "jsonl":
            max_row_bytes = self.input_config.jsonl.max_row_bytes
            schema = jsonl_schema([opened[item.path] for item in self.inputs],  # as the plan inferred it
                                  max_row_bytes=max_row_bytes)
            return _read_in_ranges(files, functools.partial(_jsonl_ranges_of, split_bytes=split_bytes),
                                   _scan_jsonl_if_split,
                                   lambda piece: _read_jsonl_piece(piece, schema, columns, max_row_bytes),
                                   given, counts, specs)
        return _read_in_ranges(files, functools.partial(_ranges_of, split_bytes=split_bytes, options=options),
                               functools.partial(_scan_if_split, options=options),
                               lambda piece: _read_piece(piece, options, columns), given, counts, specs)


def _read_in_ranges(files, ranges, scan, read, given: dict[str, str], counts: str | None,
                    specs: Sequence[FeatureSpec] | None):
    """Files cut in byte ranges, each scanned (line breaks counted) in parallel, then read as pieces (CSV, JSON lines)."""
    return (files
            | "Ranges" >> beam.FlatMap(ranges)
            | "SpreadRanges" >> beam.Reshuffle()
            | "ScanRanges" >> beam.Map(scan)
            | "ByFile" >> beam.GroupByKey()
            | "PlanPieces" >> beam.FlatMap(_plan_pieces)
            | "SpreadPieces" >> beam.Reshuffle()
            | "ReadPiece" >> beam.FlatMap(lambda piece: converted_ahead(_counted(rows_checked(
                _as_given(read(piece), given), given.get(piece.path, piece.path), "the text"), _counter(counts)), specs))
            .with_output_types(SourceBatch))


def _jsonl_ranges_of(item: tuple[str, int], split_bytes: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(path, (start, end, number of ranges, 0)) for each range a JSON lines file is scanned in (compressed: whole)."""
    path, size = item
    if size <= split_bytes or is_compressed(path):
        return [(path, (0, size, 1, 0))]
    ranges = csv_ranges(size, split_bytes)
    return [(path, (start, end, len(ranges), 0)) for start, end in ranges]


def _scan_jsonl_if_split(item) -> tuple[str, RangeScan | None]:
    path, (start, end, count, _) = item
    if count == 1:
        return path, None
    return path, RangeScan(path, start, end, count_line_breaks(path, start, end), False)


def _read_jsonl_piece(piece: _CsvPiece, schema, columns, max_row_bytes: int) -> Iterator[SourceBatch]:
    if piece.whole:
        return read_jsonl_file(piece.path, schema, columns, max_row_bytes=max_row_bytes)
    return read_jsonl_range(piece.path, piece.start, piece.end, piece.line_breaks_before, schema, columns,
                            max_row_bytes=max_row_bytes)


def _orc_pieces(read: ReadTabular):
    """One piece per ORC stripe (see orc.stripe_listing)."""
    columns = read.columns

    def pieces(item: tuple[str, int]) -> list[_TypedPiece]:
        path, size = item
        listing, rows = stripe_listing_and_rows(path)
        own = _rows_of_pieces([before for _, _, before in listing], rows)
        return [_TypedPiece(path, first, count, before, size / rows if rows else 0.0, stripe_rows, rows, "stripe")
                for (first, count, before), stripe_rows in zip(listing, own)]

    return pieces, lambda piece: read_orc_stripes(piece.path, piece.first, piece.count, piece.rows_before, columns)


def _avro_pieces(read: ReadTabular):
    """Runs of Avro sync blocks of about split_bytes (see avro.avro_blocks), read with the first file's schema."""
    first = read.opened_as[read.inputs[0].path]
    reader_schema = avro_schema(first)
    schema = arrow_schema(reader_schema, first)
    columns, split_bytes = read.columns, read.input_config.split_bytes

    def pieces(item: tuple[str, int]) -> list[_TypedPiece]:
        path, size = item
        runs, records = avro_blocks(path, size, split_bytes)
        own = _rows_of_pieces([before for _, _, before in runs], records)
        return [_TypedPiece(path, offset, blocks, before, size / records if records else 0.0, run_records, records,
                            "block")
                for (offset, blocks, before), run_records in zip(runs, own)]

    return pieces, lambda piece: read_avro_blocks(piece.path, piece.first, piece.count, piece.rows_before,
                                                  reader_schema, schema, columns)


_TYPED_PIECES = {"orc": _orc_pieces, "avro": _avro_pieces}


def _read_tfrecord(read: ReadTabular, files, given: dict[str, str], specs: Sequence[FeatureSpec] | None):
    """TFRecord files in record ranges (see tfrecord.tfrecord_pieces), decoded as the plan's schema (the manifest's
    features, or those the first records show), projected to the columns read; progress counts each block."""
    input_config, columns, counts = read.input_config, read.columns, read.progress_dir
    schema = tfrecord_schema(input_config, read.inputs, declared=read.convert_with)
    expected = {read.opened_as.get(path, path): count for path, count in shard_records(input_config).items()}

    def pieces(item: tuple[str, int]) -> list[tuple[str, str | None, tuple[int, int | None, int], int | None, int | None]]:
        """(path, compression, record range, its records, the file's records) per piece, the records as the file's read
        index (a split file) or its dataset's manifest (a shard read whole) announces them, where either does."""
        path, size = item
        compression = file_compression(input_config, path)
        ranges, records = tfrecord_pieces_and_records(path, size, input_config.split_bytes, compression)
        records = records if records is not None else expected.get(path)
        if records is None:
            return [(path, compression, piece, None, None) for piece in ranges]
        own = _rows_of_pieces([before for _, _, before in ranges], records)
        return [(path, compression, piece, rows, records) for piece, rows in zip(ranges, own)]

    def read_piece(item) -> Iterator[SourceBatch]:
        path, compression, (start, stop, before), rows, records = item
        counter = _counter(counts)
        read = read_tfrecord_piece(path, start, stop, before, schema, compression, columns,
                                   on_block=counter.add if counter is not None else None,
                                   expected_records=expected.get(path))
        return rows_checked(_as_given(read, given), given.get(path, path), f"records {before + 1} on", rows, records)

    return (files
            | "Pieces" >> beam.FlatMap(pieces)
            | "SpreadPieces" >> beam.Reshuffle()
            | "ReadPiece" >> beam.FlatMap(lambda item: converted_ahead(read_piece(item), specs))
            .with_output_types(SourceBatch))


def converted_ahead(sources: Iterator[SourceBatch], specs: Sequence[FeatureSpec] | None) -> Iterator[SourceBatch]:
    """The batches, each with its feature columns (``converted``) when specs are given, converted by a thread ahead."""
    if specs is None:
        return sources

    def convert() -> Generator[SourceBatch, None, None]:
        try:
            for source in sources:
                yield from convert_in_slices(source, specs)  # from_file features: in slices of bounded file bytes
        finally:
            close = getattr(sources, "close", None)
            if close is not None:
                close()  # the readers' own threads and files, from the thread that read them

    return read_ahead(convert(), "tfrbeam-convert")


def _as_given(sources: Iterable[SourceBatch], given: dict[str, str]) -> Iterator[SourceBatch]:
    """The batches, naming their file (and their bad rows') as the listing gave it, not as it was opened."""
    for source in sources:
        shown = given.get(source.path)
        if shown is not None:
            bad_rows = tuple(replace(row, path=shown) if row.path == source.path else row
                             for row in source.bad_rows)
            source = replace(source, path=shown, bad_rows=bad_rows)
        yield source


def _counter(directory: str | None) -> ProgressCounter | None:
    return ProgressCounter(directory) if directory is not None else None


def _ranges_of(item: tuple[str, int], split_bytes: int, options: CsvOptions) -> list[tuple[str, tuple[int, int, int, int]]]:
    """(path, (start, end, number of ranges, data offset)) for each range a file is scanned in."""
    path, size = item
    if size <= split_bytes or is_compressed(path) or not splittable_encoding(options.encoding):
        return [(path, (0, size, 1, 0))]
    ranges = csv_ranges(size, split_bytes)
    data_offset = csv_data_offset(path, options)
    return [(path, (start, end, len(ranges), data_offset)) for start, end in ranges]


def _scan_if_split(item, options: CsvOptions) -> tuple[str, RangeScan | None]:
    path, (start, end, count, data_offset) = item
    if count == 1:
        return path, None
    return path, scan_csv_range(path, start, end, options, data_offset)


def _plan_pieces(item) -> list[_CsvPiece]:
    path, scans = item
    scans = [scan for scan in scans if scan is not None]
    if not scans:
        return [_CsvPiece(path, 0, -1, 0, True)]
    scans.sort(key=lambda scan: scan.start)
    if any(scan.has_special for scan in scans):
        _LOG.info("%s: quote or escape characters occur, so it is read whole by one worker", path)
        return [_CsvPiece(path, 0, -1, 0, True)]
    pieces, before = [], 0
    for scan in scans:
        pieces.append(_CsvPiece(path, scan.start, scan.end, before, False))
        before += scan.line_breaks
    return pieces


def _read_piece(piece: _CsvPiece, options: CsvOptions, columns) -> Iterator[SourceBatch]:
    if piece.whole:
        return read_csv_file(piece.path, options, columns)
    return read_csv_range(piece.path, piece.start, piece.end, piece.line_breaks_before, options, columns)
