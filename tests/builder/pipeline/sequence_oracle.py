"""An independent SequenceExample build of a table, for the build's tests: pyarrow's group_by and sort_by, then
``encode_sequence_example`` per group, row by row in Python (none of the build's columnar code).

The rules it implements are the README's: rows with a null group key are bad rows; a group's steps
are sorted by order_by (nulls last), ties by the XXH3-128 of the row encoded as an Example; a
group whose context feature takes two values is bad; groups under min_steps are dropped; longer
than max_steps, a group is cut (split), cut short (truncate) or bad (error); a group's split is the
XXH3-128 of its split_key features encoded as an Example against the cumulative fractions.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from tests.helpers import with_float32_bits
from tfrbeam.codec.example import decode_sequence_example, encode_example, encode_sequence_example
from tfrbeam.tfrecord.records import read_records


@dataclasses.dataclass
class SplitCounts:
    examples: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # encoded bytes -> count
    groups: int = 0
    steps: list[int] = dataclasses.field(default_factory=list)
    too_few: int = 0
    bad: int = 0
    split_groups: int = 0
    truncated: int = 0
    context_present: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    steps_present: collections.Counter = dataclasses.field(default_factory=collections.Counter)


@dataclasses.dataclass
class Oracle:
    splits: dict[str, SplitCounts]
    null_key_rows: int
    bad_groups: dict[tuple, int]  # group key -> rows, for the dead letters
    bad_group_rows: int


def _hash_words(data: bytes) -> tuple[int, int]:
    low, high = np.frombuffer(xxhash.xxh3_128_digest(data), dtype="<u8").tolist()
    return low, high


def _present(row: dict, names: Sequence[str]) -> dict:
    return {name: row[name] for name in names if row[name] is not None}


def _split_of(row: dict, split_key: Sequence[str], kinds: dict[str, str], fractions: Sequence[float]) -> int:
    word = _hash_words(encode_example(_present(row, split_key), {name: kinds[name] for name in split_key}))[0]
    cumulative = [math.fsum(fractions[: i + 1]) for i in range(len(fractions) - 1)]
    thresholds = [min(int(round(c * 2**64)), 2**64 - 1) for c in cumulative]
    return sum(word >= threshold for threshold in thresholds)


def oracle(table: pa.Table, kinds: dict[str, str], splits: dict[str, float], group_by: Sequence[str],
           order_by: Sequence[str] = (), context: Sequence[str] = (), max_steps: int | None = None,
           overflow: str = "split", min_steps: int = 1, split_key: Sequence[str] | None = None) -> Oracle:
    """The expected SequenceExamples of ``table`` (columns already of the features' types) and every count."""
    names = list(kinds)
    split_key = list(split_key or group_by)
    context_names = [*group_by, *context]
    lists = [name for name in names if name not in context_names]
    rows = table.select(names).to_pylist()
    key_valid = [all(row[name] is not None for name in group_by) for row in rows]
    hashes = [_hash_words(encode_example(_present(row, names), kinds)) for row in rows]
    indexed = table.select(names).append_column("__row", pa.array(range(len(rows)), pa.int64()))
    indexed = indexed.filter(pa.array(key_valid))
    grouped = indexed.group_by(list(group_by), use_threads=False).aggregate([("__row", "list")])
    result = Oracle({name: SplitCounts() for name in splits}, key_valid.count(False), {}, 0)
    split_names = list(splits)
    for members in grouped.column("__row_list").to_pylist():
        steps = pa.table({
            **{f"o{i}": table.column(name).take(members) for i, name in enumerate(order_by)},
            "h0": pa.array([hashes[m][0] for m in members], pa.uint64()),
            "h1": pa.array([hashes[m][1] for m in members], pa.uint64()),
            "row": pa.array(members, pa.int64()),
        }).sort_by([*[(f"o{i}", "ascending") for i in range(len(order_by))], ("h0", "ascending"), ("h1", "ascending")])
        ordered = [rows[m] for m in steps.column("row").to_pylist()]
        counts = result.splits[split_names[_split_of(ordered[0], split_key, kinds, list(splits.values()))]]
        key = tuple(ordered[0][name] for name in group_by)
        varies = any(len({repr(row[name]) for row in ordered}) > 1 for name in context)
        if varies or (overflow == "error" and max_steps is not None and len(ordered) > max_steps):
            counts.bad += 1
            result.bad_groups[key] = len(ordered)
            result.bad_group_rows += len(ordered)
            continue
        if len(ordered) < min_steps:
            counts.too_few += 1
            continue
        counts.groups += 1
        chunks = [ordered]
        if max_steps is not None and len(ordered) > max_steps:
            if overflow == "truncate":
                counts.truncated += len(ordered) - max_steps
                chunks = [ordered[:max_steps]]
            else:
                chunks = [ordered[start:start + max_steps] for start in range(0, len(ordered), max_steps)]
                counts.split_groups += 1
        for chunk in chunks:
            first = chunk[0]
            record = encode_sequence_example(
                _present(first, context_names),
                {name: [[] if row[name] is None else row[name] for row in chunk] for name in lists},
                kinds={name: kinds[name] for name in context_names},
                feature_list_kinds={name: kinds[name] for name in lists})
            counts.examples[record] += 1
            counts.steps.append(len(chunk))
            counts.context_present.update(name for name in context_names if first[name] is not None)
            counts.steps_present.update(name for row in chunk for name in lists if row[name] is not None)
    return result


def dataset_records(dataset: pathlib.Path) -> dict[str, list[bytes]]:
    """Every split's records, in shard order."""
    manifest = json.loads((dataset / "tfrbeam_dataset.json").read_text())
    return {name: [record for shard in split["shards"] for record in read_records(str(dataset / shard["path"]))]
            for name, split in manifest["splits"].items()}


def decoded(records: Any) -> collections.Counter:
    """A multiset of decoded SequenceExamples (floats by their float32 bits, so NaN equals NaN)."""
    counter: collections.Counter = collections.Counter()
    for record, count in (records.items() if isinstance(records, collections.Counter) else ((r, 1) for r in records)):
        context, lists = decode_sequence_example(record, kinds=True)
        shown = with_float32_bits((sorted(context.items()), sorted((name, steps) for name, steps in lists.items())))
        counter[json.dumps(shown, default=lambda value: value.hex() if isinstance(value, bytes) else str(value))] += count
    return counter


def check_manifest_counts(manifest: dict, expected: Oracle, rows_read: int, bad_rows: int) -> None:
    """Every count of a sequence manifest against the oracle's."""
    assert manifest["record_type"] == "SequenceExample"
    assert manifest["rows_read"] == rows_read
    assert manifest["bad_records"]["count"] == bad_rows + expected.bad_group_rows
    for name, split in manifest["splits"].items():
        counts = expected.splits[name]
        steps = counts.steps
        assert split["num_examples"] == len(steps) == sum(counts.examples.values()), name
        assert split["num_groups"] == counts.groups, name
        assert split["steps"] == {"total": sum(steps), "min": min(steps, default=0),
                                  "mean": sum(steps) / len(steps) if steps else 0.0, "max": max(steps, default=0)}, name
        assert split["dropped_groups"] == {"too_few_steps": counts.too_few, "bad": counts.bad}, name
        assert split["split_groups"] == counts.split_groups and split["truncated_steps"] == counts.truncated, name
        assert split["examples_with_feature"] == {feature: counts.context_present[feature]
                                                  for feature in manifest["context_features"]}, name
        assert split["steps_with_feature"] == {feature: counts.steps_present[feature]
                                               for feature in manifest["sequence_features"]}, name
    examples = sum(len(counts.steps) for counts in expected.splits.values())
    total_steps = sum(sum(counts.steps) for counts in expected.splits.values())
    for feature, entry in manifest["context_features"].items():
        present = sum(counts.context_present[feature] for counts in expected.splits.values())
        assert entry["always_present"] == (present == examples), feature
    for feature, entry in manifest["sequence_features"].items():
        present = sum(counts.steps_present[feature] for counts in expected.splits.values())
        assert entry["always_present"] == (present == total_steps), feature
