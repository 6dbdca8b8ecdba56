"""Split strings as TFDS spells them (``train[:10%]``, ``train[1000:2000]``, ``train[:10%]+eval``) and even parts.

A split string selects record ranges of a build's splits, records numbered in the manifest's shard order.
Percent boundaries round as TFDS's default (``rounding="closest"``): ``int(round(p * n / 100.0))`` with Python's
float ``round`` (half to even), so a slice holds the very records TFDS would give for the same shard lengths.
``even_splits`` adds a part selector, ``train{i/n}`` (part i, from 0, of n), resolved as ``tfds.even_splits`` is:
each ``+`` term's range cut into n contiguous parts, the first ``len % n`` one record longer (or those
records dropped with ``drop_remainder``, written ``{i/n,drop_remainder}``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping, Sequence

from tfrbeam.errors import ConfigError

_LOG = logging.getLogger(__name__)

VALID_FORMS = (
    "valid forms: 'train', 'train[:10%]', 'train[10%:]', 'train[1000:2000]', 'train[-100:]', 'train[2shard]', "
    "'train[:10%]+eval', 'all', and even parts 'train{0/4}' (from tfrbeam.even_splits)"
)
# <name>[<selector>]{<part>}...: TFDS's term syntax, plus the part selectors that even_splits writes.
_TERM_RE = re.compile(r"^(?P<name>[\w-]+)(\[(?P<selector>[\w%:-]+)\])?(?P<parts>(\{[^{}]*\})*)$")
_BOUND_RE = re.compile(r"^((?P<value>-?[\d_]+)(?P<unit>%|shard)?)?$")
_PART_RE = re.compile(r"^(?P<index>\d+)/(?P<count>\d+)(?P<drop>,drop_remainder)?$")
_PLUS_RE = re.compile(r"\s*\+\s*")


@dataclasses.dataclass(frozen=True)
class EvenPart:
    """Part ``index`` of ``count`` contiguous, even parts of a range."""

    index: int
    count: int
    drop_remainder: bool = False

    def __str__(self) -> str:
        return f"{{{self.index}/{self.count}{',drop_remainder' if self.drop_remainder else ''}}}"

    def of(self, start: int, stop: int) -> tuple[int, int]:
        """This part of records ``start:stop`` (as ``tfds.even_splits``: the first ``len % count`` parts one longer)."""
        total = stop - start
        each, extra = divmod(total, self.count)
        begin, end = start + each * self.index, start + each * (self.index + 1)
        if extra and not self.drop_remainder:
            begin += min(self.index, extra)
            end += min(self.index + 1, extra)
        return begin, end


@dataclasses.dataclass(frozen=True)
class SplitTerm:
    """One ``+`` term: a split, an optional slice (``unit`` "abs", "%" or "shard") and the even parts taken of it."""

    split: str
    start: int | None = None
    stop: int | None = None
    unit: str = "abs"
    parts: tuple[EvenPart, ...] = ()


@dataclasses.dataclass(frozen=True)
class ShardRange:
    """Records ``start:stop`` of shard number ``shard`` (manifest order) of ``split``."""

    split: str
    shard: int
    start: int
    stop: int


def split_error(text: str, problem: str) -> ConfigError:
    return ConfigError(f"split {text!r}: {problem}; {VALID_FORMS}")


def parse_split(text: str) -> tuple[SplitTerm, ...]:
    """The terms of a split string (syntax only: sizes are checked by ``record_ranges``)."""
    if not isinstance(text, str) or not text.strip():
        raise split_error(str(text), "is empty or not a string")
    return tuple(_parse_term(text, term) for term in _PLUS_RE.split(text.strip()))


def _parse_term(text: str, term: str) -> SplitTerm:
    match = _TERM_RE.match(term)
    if match is None:
        raise split_error(text, f"term {term!r} is not a split name with an optional [slice]")
    parts = tuple(_parse_part(text, part) for part in re.findall(r"\{([^{}]*)\}", match["parts"]))
    name, selector = match["name"], match["selector"]
    if selector is None:
        return SplitTerm(name, parts=parts)
    if name == "all":
        raise split_error(text, "'all' cannot be sliced; slice each split and join them with '+'")
    bounds = [_BOUND_RE.match(bound) for bound in selector.split(":")]
    if len(bounds) > 2 or not all(bounds) or not any(bound and bound[0] for bound in bounds):
        raise split_error(text, f"[{selector}] is not a slice [start:stop] of numbers, percents or shards")
    units = {bound["unit"] for bound in bounds if bound and bound["unit"]}
    if len(units) > 1:
        raise split_error(text, f"[{selector}] mixes units {sorted(units)}; use one unit for both ends")
    unit = units.pop() if units else "abs"
    values = [None if not bound or bound["value"] is None else int(bound["value"]) for bound in bounds]
    if len(values) == 1:
        if unit != "shard":
            raise split_error(text, f"[{selector}] is one index, which only shards take ([2shard]); "
                                    "write a slice [start:stop]")
        assert values[0] is not None
        values = [values[0], values[0] + 1]
    if unit == "%" and any(value is not None and abs(value) > 100 for value in values):
        raise split_error(text, f"[{selector}] has a percent outside [-100, 100]")
    return SplitTerm(name, values[0], values[1], unit, parts)


def _parse_part(text: str, part: str) -> EvenPart:
    match = _PART_RE.match(part)
    if match is None:
        raise split_error(text, f"{{{part}}} is not an even part {{index/count}} or {{index/count,drop_remainder}}")
    index, count = int(match["index"]), int(match["count"])
    if not 0 <= index < count:
        raise split_error(text, f"{{{part}}}: part index {index} is not in [0, {count})")
    return EvenPart(index, count, bool(match["drop"]))


def percent_to_records(percent: int, total: int) -> int:
    """TFDS's ``rounding="closest"``: the nearest record boundary, ties to even (Python's float ``round``)."""
    return int(round(percent * total / 100.0))


def term_range(text: str, term: SplitTerm, shard_lengths: Sequence[int]) -> tuple[int, int]:
    """The term's records ``start:stop`` in its split (before its even parts), checked against the split's size."""
    total = sum(shard_lengths)
    start, stop = term.start, term.stop
    if term.unit == "%":
        start = 0 if start is None else percent_to_records(start, total)
        stop = total if stop is None else percent_to_records(stop, total)
    elif term.unit == "shard":
        count = len(shard_lengths)
        if any(value is not None and abs(value) > count for value in (start, stop)):
            raise split_error(text, f"split {term.split!r} has {count} shards")
        start = 0 if start is None else sum(shard_lengths[:start])
        stop = total if stop is None else sum(shard_lengths[:stop])
    else:
        start = 0 if start is None else start
        stop = total if stop is None else stop
        if abs(start) > total or abs(stop) > total:
            raise split_error(text, f"[{term.start or ''}:{term.stop or ''}] is outside split {term.split!r}, "
                                    f"which has {total} records")
    start = start + total if start < 0 else start
    stop = stop + total if stop < 0 else stop
    if start > stop:
        raise split_error(text, f"the slice of {term.split!r} starts at record {start}, after its stop {stop}")
    return start, stop


def split_ranges(text: str, shard_lengths: Mapping[str, Sequence[int]]) -> list[tuple[str, int, int]]:
    """(split, start, stop) of every term of ``text``, its even parts applied; ``all`` is every split in order."""
    out: list[tuple[str, int, int]] = []
    for term in parse_split(text):
        names = list(shard_lengths) if term.split == "all" and "all" not in shard_lengths else [term.split]
        for name in names:
            if name not in shard_lengths:
                raise ConfigError(f"split {text!r}: the dataset has no split {name!r}; it has {sorted(shard_lengths)}")
            start, stop = term_range(text, dataclasses.replace(term, split=name), shard_lengths[name])
            for part in term.parts:
                start, stop = _part_of(part, start, stop)
            out.append((name, start, stop))
    return out


def _part_of(part: EvenPart, start: int, stop: int) -> tuple[int, int]:
    if part.drop_remainder and (stop - start) % part.count:
        _LOG.info("even part %s: dropping %d of %d records", part, (stop - start) % part.count, stop - start)
    return part.of(start, stop)


def record_ranges(text: str, shard_lengths: Mapping[str, Sequence[int]]) -> tuple[ShardRange, ...]:
    """The shard record ranges ``text`` reads, in order (shards it does not touch are left out, as TFDS does)."""
    out: list[ShardRange] = []
    for name, start, stop in split_ranges(text, shard_lengths):
        base = 0
        for shard, length in enumerate(shard_lengths[name]):
            begin, end = max(start, base), min(stop, base + length)
            if begin < end:
                out.append(ShardRange(name, shard, begin - base, end - base))
            base += length
    return tuple(out)


def even_splits(split: str, n: int, *, drop_remainder: bool = False) -> list[str]:
    """``n`` split strings that partition ``split`` (any split string) into contiguous parts of even size.

    As ``tfds.even_splits``: each ``+`` term is cut into ``n`` parts, the first ``len % n`` parts one record
    longer, or (``drop_remainder=True``) all the same length, the last ``len % n`` records of the term dropped.
    Give host ``jax.process_index()`` the string at its index.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"even_splits n={n!r}: the number of parts must be an integer of at least 1")
    parse_split(split)  # a bad string is refused here, not on every host later
    terms = _PLUS_RE.split(split.strip())
    return ["+".join(f"{term}{EvenPart(index, n, drop_remainder)}" for term in terms) for index in range(n)]
