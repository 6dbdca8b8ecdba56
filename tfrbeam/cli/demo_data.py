"""Write the small demo dataset the example configs read: ``tfrbeam demo-data demo_data``.

A made-up flights table, the same bytes on every run: ``csv/flights-0000{0,1,2}.csv`` (quoted
fields with commas, empty fields as nulls, ``;``- and ``|``-separated lists, and three broken rows
for the dead-letter demo) and ``parquet/flights-0000{0,1}.parquet`` (native list columns, nulls,
and a few null labels that the Parquet example sends to the dead letters), and
``sequences/flights-by-aircraft.csv``: a log of the flights of a few aircraft in time order, for
the SequenceExample example (one sequence per aircraft; two flights of one aircraft share a
departure time, and one aircraft changes carrier, which makes its group a bad one). Beside them,
``demo.yaml``: the build config of configs/demo.yaml reading this directory's CSV files, so
``tfrbeam build DIR/demo.yaml`` works in any directory, with no clone of the repository.
"""

from __future__ import annotations

import csv
import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

CSV_FILES = 3
PARQUET_FILES = 2
DEFAULT_ROWS = 3000
EMBEDDING_SIZE = 4
_CARRIERS = ("AA", "B6", "DL", "UA", "WN")
_AIRPORTS = (
    ("ATL", "Atlanta, GA"), ("BOS", "Boston, MA"), ("DCA", "Washington, DC"), ("DEN", "Denver, CO"),
    ("JFK", "New York, NY"), ("LAX", "Los Angeles, CA"), ("ORD", "Chicago, IL"), ("SEA", "Seattle, WA"),
)
_TAGS = ("redeye", "holiday", "\"quoted\"", "wifi", "late")
CSV_HEADER = ("flight_id", "carrier", "origin", "origin_city", "dest", "distance", "dep_delay", "tailnum",
              "cancelled", "embedding", "tags")
# Rows (0-based within the middle CSV file) replaced by broken ones, with what is wrong.
_BROKEN_CSV_ROWS = {
    17: lambda row: row[:5] + ["unknown"] + row[6:],  # distance is not a number
    345: lambda row: row[:-2],  # two columns missing
    678: lambda row: row[:9] + ["0.5;0.25;0.125"] + row[10:],  # embedding has 3 values, not 4
}


def demo_table(num_rows: int = DEFAULT_ROWS, seed: int = 2024) -> pa.Table:
    """The demo rows as an Arrow table (lists as lists, nulls as nulls)."""
    rng = np.random.default_rng(seed)
    origin = rng.integers(0, len(_AIRPORTS), num_rows)
    dest = (origin + rng.integers(1, len(_AIRPORTS), num_rows)) % len(_AIRPORTS)
    delay = np.round(rng.normal(5.0, 20.0, num_rows), 1)
    tail = [
        f"N{number}{letter}" for number, letter in zip(rng.integers(100, 999, num_rows), rng.choice(list("ABCDEFGH"), num_rows))
    ]
    tag_counts = rng.integers(0, 4, num_rows)
    tags = [[_TAGS[i] for i in rng.choice(len(_TAGS), count, replace=False)] for count in tag_counts]
    embedding = np.round(rng.normal(0.0, 1.0, (num_rows, EMBEDDING_SIZE)), 3).astype(np.float32)
    label_null = rng.random(num_rows) < 0.004
    return pa.table({
        "flight_id": pa.array(np.arange(1, num_rows + 1), pa.int64()),
        "carrier": pa.array(rng.choice(_CARRIERS, num_rows).tolist(), pa.string()),
        "origin": pa.array([_AIRPORTS[i][0] for i in origin], pa.string()),
        "origin_city": pa.array([_AIRPORTS[i][1] for i in origin], pa.string()),
        "dest": pa.array([_AIRPORTS[i][0] for i in dest], pa.string()),
        "distance": pa.array(np.round(rng.uniform(150.0, 2800.0, num_rows), 1)),
        "dep_delay": pa.array(delay, mask=rng.random(num_rows) < 0.05),
        "tailnum": pa.array(tail, pa.string(), mask=rng.random(num_rows) < 0.03),
        "cancelled": pa.array((rng.random(num_rows) < 0.02).astype(np.int64)),
        "embedding": pa.array(embedding.tolist(), pa.list_(pa.float32())),
        "tags": pa.array(tags, pa.list_(pa.string())),
        "label": pa.array(rng.integers(0, 2, num_rows), mask=label_null),
    })


AIRCRAFT = 40
AIRCRAFT_HEADER = ("tailnum", "carrier", "sched_dep", "origin", "dest", "distance", "dep_delay")
_BAD_AIRCRAFT = 7  # this aircraft's carrier changes halfway: its sequence group is bad (a context feature varies)


def aircraft_flights_table(aircraft: int = AIRCRAFT, seed: int = 7) -> pa.Table:
    """A flight log of ``aircraft`` aircraft in departure order: a few to 60 flights each, each aircraft one carrier."""
    rng = np.random.default_rng(seed)
    rows = []
    for plane in range(aircraft):
        tailnum = f"N{100 + plane * 17}{'ABCDEFGH'[plane % 8]}"
        carrier = _CARRIERS[plane % len(_CARRIERS)]
        flights = int(rng.integers(2, 61))
        minutes = np.sort(rng.choice(60 * 24 * 30, flights, replace=False)) * 10  # 10-minute slots in 300 days
        if plane == 3:
            minutes[1] = minutes[0]  # two flights of one aircraft at the same time: a tie in order_by
        airport = int(rng.integers(0, len(_AIRPORTS)))
        for number, minute in enumerate(minutes.tolist()):
            dest = (airport + int(rng.integers(1, len(_AIRPORTS)))) % len(_AIRPORTS)
            changed = plane == _BAD_AIRCRAFT and number >= flights // 2
            delay = None if rng.random() < 0.05 else round(float(rng.normal(5.0, 20.0)), 1)
            rows.append({
                "tailnum": tailnum, "carrier": "WN" if changed and carrier != "WN" else "AA" if changed else carrier,
                "sched_dep": (np.datetime64("2024-01-01T00:00") + np.timedelta64(minute, "m")).astype(str) + ":00Z",
                "origin": _AIRPORTS[airport][0], "dest": _AIRPORTS[dest][0],
                "distance": round(float(rng.uniform(150.0, 2800.0)), 1), "dep_delay": delay,
            })
            airport = dest
    rows.sort(key=lambda row: (row["sched_dep"], row["tailnum"]))
    return pa.Table.from_pylist(rows)


def _csv_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ";".join(f"{item:.6g}" for item in value) if value and isinstance(value[0], float) else "|".join(value)
    return str(value)


def _csv_text(rows: list[dict], broken: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for position, row in enumerate(rows):
        cells = [_csv_cell(row[name]) for name in CSV_HEADER]
        if position in broken:
            cells = broken[position](cells)
        writer.writerow(cells)
    return out.getvalue()


CONFIG_NAME = "demo.yaml"

# configs/demo.yaml with the CSV path of the directory written (tests/cli/test_demo_data.py checks they agree).
_DEMO_CONFIG = """\
# The demo build: made-up flights CSV -> shuffled train/eval TFRecord shards, written by
#   tfrbeam demo-data {data_dir}
# beside the data it reads. Build it from the directory that command ran in:
#   tfrbeam build {config}
input:
  format: csv
  path: {csv_glob}
  csv:
    null_values: [""]
features:
  flight_id: {{type: int64}}
  carrier: {{type: bytes}}
  origin: {{type: bytes}}
  dest: {{type: bytes}}
  distance: {{type: float}}
  dep_delay: {{type: float, on_null: default, default: 0.0}}   # empty cell -> 0.0
  tailnum: {{type: bytes, on_null: omit}}                       # empty cell -> feature absent
  cancelled: {{type: int64}}                                    # 0 is a value, never "missing"
  embedding: {{type: float, separator: ";", length: 4}}
shuffle:
  enabled: true
  seed: 42
splits:
  train: 0.9
  eval: 0.1
output:
  path: out/demo
  num_shards: {{train: 4, eval: 1}}
  compression: none
errors:
  on_bad_record: dead_letter      # the demo CSV has 3 broken rows: see out/demo/_errors/
  max_bad_fraction: 0.01
"""


def demo_config_text(out_dir: str) -> str:
    """The demo build config for the data written to ``out_dir``; paths relative to where the command runs."""
    config = os.path.join(out_dir, CONFIG_NAME)
    return _DEMO_CONFIG.format(data_dir=out_dir, config=config, csv_glob=os.path.join(out_dir, "csv", "flights-*.csv"))


def write_demo_data(out_dir: str, num_rows: int = DEFAULT_ROWS) -> list[str]:
    """Write the CSV and Parquet demo files and the demo build config under ``out_dir``; returns their paths."""
    table = demo_table(num_rows)
    rows = table.to_pylist()
    paths = []
    os.makedirs(os.path.join(out_dir, "csv"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "parquet"), exist_ok=True)
    per_file = -(-num_rows // CSV_FILES)
    for index in range(CSV_FILES):
        path = os.path.join(out_dir, "csv", f"flights-{index:05d}.csv")
        broken = _BROKEN_CSV_ROWS if index == 1 else {}
        with open(path, "w", encoding="utf-8", newline="") as handle:
            handle.write(_csv_text(rows[index * per_file:(index + 1) * per_file], broken))
        paths.append(path)
    per_file = -(-num_rows // PARQUET_FILES)
    for index in range(PARQUET_FILES):
        path = os.path.join(out_dir, "parquet", f"flights-{index:05d}.parquet")
        part = table.slice(index * per_file, per_file)
        # Page checksums: a damaged page then fails the read instead of changing a value silently.
        pq.write_table(part, path, row_group_size=500, compression="snappy", write_page_checksum=True)
        paths.append(path)
    paths.append(_write_aircraft_flights(os.path.join(out_dir, "sequences")))
    config = os.path.join(out_dir, CONFIG_NAME)
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(demo_config_text(out_dir))
    paths.append(config)
    return paths


def _write_aircraft_flights(directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "flights-by-aircraft.csv")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(AIRCRAFT_HEADER)
    for row in aircraft_flights_table().to_pylist():
        writer.writerow([_csv_cell(row[name]) for name in AIRCRAFT_HEADER])
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write(out.getvalue())
    return path
