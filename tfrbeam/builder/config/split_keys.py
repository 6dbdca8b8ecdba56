"""The ``splits`` key (fractions of the content hash, a split column, or file patterns) and ``output.num_shards``
(one count, or one per split): the config keys whose shape depends on the split names."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfrbeam.builder.config.keys import Checker, Kind, Scope, show

__all__ = ["SPLIT_NAME", "ShardCounts", "SplitColumn", "SplitFiles", "Splits", "split_patterns"]

SPLIT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@dataclass(frozen=True)
class SplitColumn:
    """Splits named by an input column, as in AutoML Tables and TFRecorder: a row goes to the split its value maps to.

    values: (the column's value as text, split name) pairs; empty: the values are the split names
    themselves. A null or unmapped value makes a bad row. The column is read even when it is not a
    feature, and written into the Examples only when it is one.
    """

    column: str
    values: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SplitFiles:
    """Splits by input file, as TFX's input splits: every row of a file a split's glob matches goes to that split."""

    patterns: tuple[tuple[str, str], ...]  # (split name, glob) in config order


def split_patterns(raw: Any) -> tuple[tuple[str, str], ...]:
    """The (split, glob) pairs of file-pattern splits (a mapping of split name to string, no ``column`` key), else ()."""
    if not isinstance(raw, dict) or "column" in raw or not any(isinstance(value, str) for value in raw.values()):
        return ()
    return tuple((str(name), value) for name, value in raw.items() if isinstance(value, str))


class Splits(Kind):
    """``splits``: the split names in order, mapped to their fraction of the hash (None when the split_by field,
    which this key also sets, assigns the rows: a SplitColumn or SplitFiles)."""

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        splits, scope.values["split_by"] = _parse_splits(scope.check, scope.raw.get(name))
        return splits

    def dump(self, value: Any, owner: Any) -> Any:
        split_by = owner.split_by
        if isinstance(split_by, SplitColumn):
            return {"column": split_by.column, "map": dict(split_by.values) if split_by.values else None,
                    "names": list(value)}
        if isinstance(split_by, SplitFiles):
            return dict(split_by.patterns)
        return dict(value)


class ShardCounts(Kind):
    """``output.num_shards``: one count for every split, or a mapping of each split to its count."""

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        raw = scope.raw.get(name)
        if not isinstance(raw, dict):
            return scope.check.integer(scope.raw, name, scope.path, default, minimum=1, maximum=1_000_000)
        splits = scope.outer.value("splits") if scope.outer is not None else {}
        counts = {}
        for split, count in raw.items():
            if split not in splits:
                scope.fail(f"{name}.{split}", f"is not a split name (splits: {', '.join(splits)})")
            elif isinstance(count, bool) or not isinstance(count, int) or count < 1:
                scope.fail(f"{name}.{split}", f"{show(count)} is not a positive integer")
            else:
                counts[split] = count
        missing = [split for split in splits if split not in raw]
        if missing:
            scope.fail(name, f"gives no shard count for split{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                       "(give every split a count, or one integer for all)")
        return counts

    def dump(self, value: Any, owner: Any) -> Any:
        return dict(value) if isinstance(value, dict) else value


def _parse_splits(check: Checker, raw: Any) -> tuple[dict[str, float | None], SplitColumn | SplitFiles | None]:
    """The split names in order and what assigns rows to them: fractions of the hash, a split column or file patterns."""
    if raw is None:
        return {"train": 1.0}, None
    if not isinstance(raw, dict) or not raw:
        check.fail("splits", "expected a mapping of split name to fraction (e.g. {train: 0.8, eval: 0.2}), a split column "
                   "({column: NAME, map: {VALUE: SPLIT}}) or file patterns ({train: data/train-*.csv}), got "
                   + show(raw))
        return {"train": 1.0}, None
    if "column" in raw:
        return _parse_split_column(check, raw)
    if split_patterns(raw):
        return _parse_split_files(check, raw)
    splits: dict[str, float] = {}
    for name, fraction in raw.items():
        if not _split_name_ok(check, f"splits.{name}", name):
            continue
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            check.fail(f"splits.{name}", f"{show(fraction)} is not a fraction greater than 0 and at most 1")
            continue
        splits[name] = float(fraction)
    _check_split_case(check, list(splits), lambda name: f"splits.{name}")
    if len(splits) == len(raw) and abs(math.fsum(splits.values()) - 1.0) > 1e-9:
        check.fail("splits", f"fractions {', '.join(f'{k}: {v:g}' for k, v in splits.items())} sum to "
                   f"{math.fsum(splits.values()):.12g}, not 1")
    return {**splits}, None


def _split_name_ok(check: Checker, path: str, name: Any) -> bool:
    if isinstance(name, str) and SPLIT_NAME.match(name):
        return True
    check.fail(path, f"{show(name)} is not a valid split name (a letter, then letters, digits, _ or -; it becomes part "
               "of file names)")
    return False


def _check_split_case(check: Checker, names: list[str], path_of: Callable[[str], str]) -> None:
    """Distinct split names that differ only in case are refused: their directories and file names would clash."""
    lowered = [name.lower() for name in names]
    for name in names:
        if lowered.count(name.lower()) > 1:
            check.fail(path_of(name), "differs from another split name only in case (file names would clash)")


def _parse_split_column(check: Checker, raw: dict) -> tuple[dict[str, float | None], SplitColumn | None]:
    """splits: {column: NAME, map: {VALUE: SPLIT, ...}, names: [SPLIT, ...]}; names is required without a map."""
    section = check.mapping(raw, "splits", ("column", "map", "names"))
    column = check.string(section, "column", "splits", "")
    raw_map = section.get("map")
    values: list[tuple[str, str]] = []
    if raw_map is not None and (not isinstance(raw_map, dict) or not raw_map):
        check.fail("splits.map", f"{show(raw_map)} is not a non-empty mapping of column value to split name")
    elif raw_map is not None:
        values = _split_map(check, raw_map)
    names = _split_names(check, section.get("names"), values, raw_map is not None)
    _check_split_case(check, names, lambda name: "splits.map" if raw_map is not None else "splits.names")
    if not column or not names:
        return {"train": None}, None
    return dict.fromkeys(names), SplitColumn(column, tuple(values))


def _split_map(check: Checker, raw_map: dict) -> list[tuple[str, str]]:
    """The map's (value as the column's text, split) pairs: integer keys as digits, booleans as true/false."""
    values: list[tuple[str, str]] = []
    for key, split in raw_map.items():
        if isinstance(key, bool):
            text = "true" if key else "false"
        elif isinstance(key, (str, int)):
            text = str(key)
        else:
            check.fail(f"splits.map.{key}", f"a map key is a string, integer or boolean (the column's value), not {show(key)}")
            continue
        if any(text == seen for seen, _ in values):
            check.fail("splits.map", f"the value {text!r} is given twice")
        elif _split_name_ok(check, f"splits.map.{key}", split):
            values.append((text, split))
    return values


def _split_names(check: Checker, raw_names: Any, values: list[tuple[str, str]], mapped: bool) -> list[str]:
    """The split names of a split column in order: names if given (checked against the map), else the map's values."""
    from_map = list(dict.fromkeys(split for _, split in values))
    if raw_names is None:
        if not mapped:
            check.fail("splits.names", "is required without splits.map (the split names the column's values are, "
                       "e.g. names: [train, eval])")
        return from_map
    if not isinstance(raw_names, list) or not raw_names:
        check.fail("splits.names", f"{show(raw_names)} is not a non-empty list of split names")
        return from_map
    names = [name for name in raw_names if _split_name_ok(check, "splits.names", name)]
    if len(set(names)) < len(names):
        check.fail("splits.names", f"{show(raw_names)} names a split more than once")
    if mapped and values and set(names) != set(from_map):
        check.fail("splits.names", f"{show(raw_names)} differs from the split names of splits.map ({', '.join(from_map)})")
    return list(dict.fromkeys(names))


def _parse_split_files(check: Checker, raw: dict) -> tuple[dict[str, float | None], SplitFiles | None]:
    """splits: {SPLIT: GLOB, ...}: every row of a file a split's glob matches goes to that split."""
    if not all(isinstance(value, str) for value in raw.values()):
        for name, value in raw.items():
            if isinstance(value, str):
                check.fail(f"splits.{name}", f"{show(value)} is not a fraction greater than 0 and at most 1 (splits "
                           "mixes fractions and file patterns: give every split a fraction, or every split a glob)")
        return {"train": None}, None
    patterns: list[tuple[str, str]] = []
    for name, pattern in raw.items():
        if not _split_name_ok(check, f"splits.{name}", name):
            continue
        if not pattern:
            check.fail(f"splits.{name}", f"{show(pattern)} is not a non-empty glob")
            continue
        patterns.append((name, pattern))
    _check_split_case(check, [name for name, _ in patterns], lambda name: f"splits.{name}")
    if len(patterns) < len(raw):
        return {"train": None}, None
    return dict.fromkeys(name for name, _ in patterns), SplitFiles(tuple(patterns))
