"""Bad rows anywhere in a file reach the dead letters, and errors.max_bad_fraction is exact at its boundary.

The inputs are larger than one pyarrow CSV block (4 MiB) and than input.split_bytes, so each file
reaches the build as several batches; bad rows sit in every one of them.
"""

from __future__ import annotations

import json
import os
import pathlib

import pytest
import yaml

from tfrbeam.builder.pipeline.commit import too_many_bad
from tfrbeam.cli.build import main as build_main

ROWS_PER_FILE = 24_000
BAD_EVERY = 997  # a prime, so bad rows do not line up with any block or range boundary
TEXT_BYTES = 260  # 24,000 rows x ~270 bytes: ~6.5 MB per file, two 4 MiB blocks or seven 1 MiB ranges


def _write_csv(path: pathlib.Path, quoted: bool) -> set[int]:
    """A CSV whose rows with ``index % BAD_EVERY == 5`` have an id that is not an int64; returns their lines."""
    bad_lines, lines = set(), ["id,text"]
    for index in range(ROWS_PER_FILE):
        text = f"{path.stem}-{index}-".ljust(TEXT_BYTES, "x")
        row_id = f"{index}"
        if index % BAD_EVERY == 5:
            row_id = f"bad{index}"
            bad_lines.add(index + 2)  # the header is line 1
        lines.append(f'{row_id},"{text}"' if quoted else f"{row_id},{text}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return bad_lines


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[pathlib.Path, dict[str, set[int]]]:
    """Two files: one with quotes (read whole, block by block) and one without (read in parallel ranges)."""
    root = tmp_path_factory.mktemp("bad-rows")
    (root / "in").mkdir()
    bad = {
        "quoted.csv": _write_csv(root / "in" / "quoted.csv", quoted=True),
        "plain.csv": _write_csv(root / "in" / "plain.csv", quoted=False),
    }
    assert all(os.path.getsize(root / "in" / name) > (4 << 20) + (1 << 20) for name in bad)
    return root, bad


def _build(root: pathlib.Path, output: str, **errors) -> int:
    config = {
        "input": {"format": "csv", "path": str(root / "in" / "*.csv"), "split_bytes": "1MiB"},
        "features": {"id": {"type": "int64"}, "text": {"type": "bytes"}},
        "shuffle": {"enabled": True, "seed": 3},
        "splits": {"train": 1.0},
        "output": {"path": str(root / output), "num_shards": 2},
        "errors": errors,
    }
    path = root / f"{output}.yaml"
    path.write_text(yaml.safe_dump(config))
    return build_main([str(path), "--quiet"])


def test_dead_letters_hold_every_bad_row_of_every_batch(inputs):
    root, bad = inputs
    assert _build(root, "dl", on_bad_record="dead_letter", max_bad_fraction=0.01) == 0
    dataset = root / "dl"
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    expected_bad = sum(len(lines) for lines in bad.values())
    assert manifest["bad_records"]["count"] == expected_bad
    written: dict[str, set[int]] = {}
    for path in sorted((dataset / "_errors").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            written.setdefault(os.path.basename(entry["file"]), set()).add(entry["line"])
            assert entry["raw"].startswith(f"bad{entry['line'] - 2},") and "id" in entry["reason"]
    assert written == bad
    # Every bad row's line is one of the last block's or range's, not only the first ones.
    assert max(bad["quoted.csv"]) > ROWS_PER_FILE - BAD_EVERY


@pytest.mark.parametrize(
    "bad, rows, limit, expected",
    [
        (1, 10, 0.1, False),  # exactly at the limit is allowed
        (2, 10, 0.1, True),
        (2, 8, 0.25, False),
        (3, 8, 0.25, True),
        (0, 10, 0.0, False),
        (1, 10, 0.0, True),
        (10, 10, 1.0, False),  # a limit of 1.0 allows every row to be bad
        (0, 0, 0.0, False),
    ],
)
def test_too_many_bad_is_strictly_more_than_the_limit(bad, rows, limit, expected):
    assert too_many_bad(bad, rows, limit) is expected


def test_a_build_exactly_at_max_bad_fraction_succeeds_and_a_limit_one_row_lower_fails(inputs, capsys):
    root, bad = inputs
    rows = 2 * ROWS_PER_FILE
    bad_count = sum(len(lines) for lines in bad.values())
    exact = bad_count / rows
    assert exact * rows == bad_count  # the boundary is representable: bad == limit * rows exactly
    assert _build(root, "at-limit", on_bad_record="skip", max_bad_fraction=exact) == 0
    manifest = json.loads((root / "at-limit" / "tfrbeam_dataset.json").read_text())
    assert manifest["bad_records"]["count"] == bad_count
    assert sum(split["num_examples"] for split in manifest["splits"].values()) == rows - bad_count
    capsys.readouterr()
    below = (bad_count - 1) / rows
    assert _build(root, "over-limit", on_bad_record="skip", max_bad_fraction=below) == 1
    assert f"error: {bad_count} of {rows} input rows" in capsys.readouterr().err
    assert not (root / "over-limit" / "tfrbeam_dataset.json").exists()
