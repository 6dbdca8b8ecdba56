"""Read Parquet and CSV inputs as Arrow RecordBatches that carry their file and line numbers."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_SPLIT_BYTES = 64 << 20


@dataclass(frozen=True)
class CsvOptions:
    """The CSV dialect. quote_char None disables quoting; only null_values are ever null."""

    delimiter: str = ","
    quote_char: str | None = '"'
    escape_char: str | None = None
    header: bool = True
    column_names: tuple[str, ...] | None = None
    null_values: tuple[str, ...] = ()
    skip_rows: int = 0
    encoding: str = "utf-8"


@dataclass(frozen=True)
class InputConfig:
    """Where the rows come from: a glob of CSV or Parquet files and how to read them."""

    format: str
    path: str
    csv: CsvOptions = field(default_factory=CsvOptions)
    columns: tuple[str, ...] | None = None
    split_bytes: int = DEFAULT_SPLIT_BYTES
