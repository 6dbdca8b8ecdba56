"""Config keys declared on the dataclass fields: what a key holds, how its YAML value is checked and written back.

A config dataclass's field is a key when it is made with ``key(kind, ...)``: its name is the YAML key,
its ``Kind`` reads and writes the value, and its ``Key`` options say when it is required, which input
format it belongs to, which sibling it excludes and what it checks across keys. ``parse_section`` and
``dump_section`` walk the fields, so parsing, ``--set``, the problems' key paths and ``config_to_dict``
all follow the dataclasses, and adding a key is adding a field. A field made with ``internal()`` is
derived, not a key. Every problem is one line ``key.path: <what is wrong> (<what is allowed>)``,
collected by a ``Checker`` so that one error lists them all.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field
from typing import Any, overload

__all__ = [
    "Char",
    "Checker",
    "Choice",
    "Flag",
    "Integer",
    "Key",
    "Kind",
    "Names",
    "Number",
    "Scope",
    "Section",
    "Size",
    "Text",
    "Tokens",
    "at",
    "config_keys",
    "dump_section",
    "internal",
    "key",
    "parse_section",
    "parse_size",
    "show",
]

INT64_MAX = (1 << 63) - 1
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_METADATA = "tfrbeam.config.key"
_ALWAYS = object()  # Key.skip_if default: the key is always written


def show(value: Any) -> str:
    """A value as the user wrote it: strings quoted, YAML null as null."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def at(path: str, key: Any) -> str:
    """The key path of key inside the section at path ("" is the top level)."""
    return f"{path}.{key}" if path else str(key)


def parse_size(value: Any) -> int:
    """A byte count from an int or a string like "256MiB", "1GB", "512 KiB" (KB = 1000, KiB = 1024)."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a size")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = match.groups()
            size = float(number) * _SIZE_UNITS[(unit or "b").lower()]
            if size == int(size):
                return int(size)
    raise ValueError("not a size")


class Checker:
    """Collects every problem of a raw config with its key path, so one error lists them all."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def mapping(self, raw: Any, path: str, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
        """The mapping at path (None = empty); unknown keys and missing required keys are problems."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.fail(path or "(top level)", f"expected a mapping with keys {', '.join(allowed)}, got {show(raw)}")
            return {}
        for name in raw:
            if name not in allowed:
                hint = difflib.get_close_matches(str(name), allowed, n=1)
                suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
                self.fail(at(path, name), f"unknown key (allowed: {', '.join(allowed)}){suggestion}")
        for name in required:
            if raw.get(name) is None:
                self.fail(at(path, name), "is required")
        return raw

    def choice(self, raw: dict, key: str, path: str, allowed: tuple[str, ...], default: str) -> str | None:
        """One of allowed (default when absent); None after reporting a value that is not allowed."""
        value = raw.get(key, default)
        if value is None:
            return default
        if value not in allowed:
            hint = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.75)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
            self.fail(at(path, key), f"{show(value)} is not one of {', '.join(allowed)}{suggestion}")
            return None
        return value

    @overload
    def integer(self, raw: dict, key: str, path: str, default: int, minimum: int, maximum: int = ...) -> int: ...
    @overload
    def integer(self, raw: dict, key: str, path: str, default: None, minimum: int, maximum: int = ...) -> int | None: ...

    def integer(self, raw: dict, key: str, path: str, default: int | None, minimum: int, maximum: int = INT64_MAX) -> int | None:
        value = raw.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(at(path, key), f"{show(value)} is not an integer (allowed: {minimum} to {maximum})")
            return default
        if not minimum <= value <= maximum:
            self.fail(at(path, key), f"{show(value)} is out of range (allowed: {minimum} to {maximum})")
            return default
        return value

    @overload
    def string(self, raw: dict, key: str, path: str, default: str) -> str: ...
    @overload
    def string(self, raw: dict, key: str, path: str, default: None) -> str | None: ...

    def string(self, raw: dict, key: str, path: str, default: str | None) -> str | None:
        value = raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str) or not value:
            self.fail(at(path, key), f"{show(value)} is not a non-empty string")
            return default
        return value

    def size(self, raw: dict, key: str, path: str, default: Any) -> Any:
        """A positive byte count (parse_size), default when absent or after reporting a value that is not one."""
        value = raw.get(key)
        if value is None:
            return default
        try:
            size = parse_size(value)
        except ValueError:
            size = 0
        if size < 1:
            self.fail(at(path, key), f"{show(value)} is not a positive size (an integer number of bytes, "
                      "or a string like \"256MiB\", \"1GB\", \"512KiB\")")
            return default
        return size


# ------------------------------------------------------------------------------------------ kinds


class Kind:
    """How one key's YAML value is read (with its problems) and written back."""

    empty: Any = None  # the value of a key that has no default and is not given (a problem already)
    extra_keys: tuple[str, ...] = ()  # keys beside the field's own name that this kind reads

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        raise NotImplementedError

    def dump(self, value: Any, owner: Any) -> Any:
        return value


@dataclass(frozen=True)
class Flag(Kind):
    hint: str = "true or false"

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        value = scope.raw.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            scope.fail(name, f"{show(value)} is not a boolean ({self.hint})")
            return default
        return value


@dataclass(frozen=True)
class Integer(Kind):
    minimum: int
    maximum: int = INT64_MAX

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        return scope.check.integer(scope.raw, name, scope.path, default, self.minimum, self.maximum)


@dataclass(frozen=True)
class Number(Kind):
    low: float
    high: float

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        value = scope.raw.get(name)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not self.low <= value <= self.high:
            scope.fail(name, f"{show(value)} is not a number from {self.low} to {self.high}")
            return default
        return float(value)


@dataclass(frozen=True)
class Size(Kind):
    """A byte count: an integer or a string like "256MiB"."""

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        return scope.check.size(scope.raw, name, scope.path, default)


@dataclass(frozen=True)
class Text(Kind):
    empty: Any = ""

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        value = scope.check.string(scope.raw, name, scope.path, None)  # left out: no problem here (required says it)
        return default if value is None else value


@dataclass(frozen=True)
class Char(Kind):
    """A single character; null (or false) means none when nullable."""

    nullable: bool = False

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        if name not in scope.raw:
            return default
        value = scope.raw[name]
        if (value is None or value is False) and self.nullable:
            return None
        if not isinstance(value, str) or len(value) != 1 or value in "\r\n":
            allowed = "a single character other than a line break" + (", or null for none" if self.nullable else "")
            scope.fail(name, f"{show(value)} is not {allowed}")
            return default
        return value


@dataclass(frozen=True)
class Choice(Kind):
    """One of allowed; the value written ``none`` (when that is one of them) is None in the config."""

    allowed: tuple[str, ...]
    none: str | None = None

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        written = self.dump(default, None)
        chosen = scope.check.choice(scope.raw, name, scope.path, self.allowed, written) or written
        return None if chosen == self.none else chosen

    def dump(self, value: Any, owner: Any) -> Any:
        return self.none if value is None and self.none is not None else value


@dataclass(frozen=True)
class Names(Kind):
    """A list of unique names, a tuple in the config."""

    allow_single: bool = False
    allow_empty: bool = False
    empty: Any = ()

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        value = scope.raw.get(name)
        if value is None:
            return default
        if self.allow_single and isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not (value or self.allow_empty) or not all(
                isinstance(item, str) and item for item in value):
            what = "a list of non-empty strings" if self.allow_empty else "a non-empty list of non-empty strings"
            scope.fail(name, f"{show(value)} is not {what}")
            return default
        duplicates = sorted({item for item in value if value.count(item) > 1})
        if duplicates:
            scope.fail(name, f"{show(value)} names {', '.join(map(repr, duplicates))} more than once")
            return default
        return tuple(value)

    def dump(self, value: Any, owner: Any) -> Any:
        return list(value) if value is not None else None


@dataclass(frozen=True)
class Tokens(Kind):
    """A list of strings (CSV cells), any of them empty; None when not given."""

    example: str

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        value = scope.raw.get(name)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            scope.fail(name, f"{show(value)} is not a list of strings (e.g. {self.example}); "
                       "quote values YAML would read as something else, like 'null' or '1'")
            return ()
        return tuple(value)

    def dump(self, value: Any, owner: Any) -> Any:
        return list(value) if value is not None else None


@dataclass(frozen=True)
class Section(Kind):
    """A mapping of the keys of another config dataclass. flatten: its keys sit in this section, not under a key
    of their own; optional: the section is None when left out; label: what its keys are, for problems."""

    cls: type
    flatten: bool = False
    optional: bool = False
    label: str = ""

    def parse(self, scope: Scope, name: str, default: Any) -> Any:
        if self.flatten:
            return parse_section(scope.check, self.cls, scope.raw, scope.path, outer=scope, flat=True)
        if self.optional and scope.raw.get(name) is None:
            return default
        return parse_section(scope.check, self.cls, scope.raw.get(name), at(scope.path, name), outer=scope)

    def dump(self, value: Any, owner: Any) -> Any:
        return dump_section(value, getattr(owner, "format", None)) if value is not None else None


@dataclass(frozen=True)
class Key:
    """A field's options as a config key.

    required: the key must be given when its section is (a callable decides from the section's Scope);
    for_format: an input key only for this input.format (refused for others, and written only for it);
    excludes: a sibling key it cannot be set with (given that one, this one is None; --set of either drops the
    other); default_of: the default when it depends on other keys; check: checks across keys, run once the value
    is read, returning the value kept; skip_if: config_to_dict leaves the key out when it holds this value.
    """

    kind: Kind
    required: bool | Callable[[Scope], bool] = False
    for_format: str | None = None
    excludes: str | None = None
    default_of: Callable[[Scope], Any] | None = None
    check: Callable[[Scope, Any], Any] | None = None
    skip_if: Any = _ALWAYS


def key(kind: Kind, default: Any = MISSING, *, default_factory: Any = MISSING, **options: Any) -> Any:
    """A dataclass field that is a config key of the field's name (Key's options)."""
    return field(default=default, default_factory=default_factory, metadata={_METADATA: Key(kind, **options)})


def internal(default: Any = MISSING, *, default_factory: Any = MISSING) -> Any:
    """A dataclass field that is not a config key: derived from keys (or set by code), never read from the YAML."""
    return field(default=default, default_factory=default_factory, metadata={_METADATA: None})


def _keys_of(cls: type) -> Iterator[tuple[dataclasses.Field, Key]]:
    """The key fields of a config dataclass, in order; a field declared neither key() nor internal() is a bug."""
    for item in dataclasses.fields(cls):
        if _METADATA not in item.metadata:
            raise TypeError(f"{cls.__name__}.{item.name} is declared neither key(...) nor internal()")
        declared = item.metadata[_METADATA]
        if declared is not None:
            yield item, declared


def _yaml_keys(cls: type, skip: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The YAML keys a section of cls allows, in field order (a flattened section's keys in its place)."""
    names: list[str] = []
    for item, declared in _keys_of(cls):
        if item.name in skip:
            continue
        if isinstance(declared.kind, Section) and declared.kind.flatten:
            names.extend(_yaml_keys(declared.kind.cls))
        else:
            names.extend((item.name, *declared.kind.extra_keys))
    return tuple(names)


def config_keys(cls: type, path: str = "") -> Iterator[tuple[str, Key]]:
    """Every key of a config dataclass and of the sections under it, as (key path, Key), each section after its keys."""
    for item, declared in _keys_of(cls):
        kind = declared.kind
        if isinstance(kind, Section):
            yield from config_keys(kind.cls, path if kind.flatten else at(path, item.name))
            if kind.flatten:
                continue
        yield at(path, item.name), declared


def _default(item: dataclasses.Field, kind: Kind) -> Any:
    if item.default is not MISSING:
        return item.default
    if item.default_factory is not MISSING:
        return item.default_factory()
    return kind.empty


# ------------------------------------------------------------------------------------ parse, dump


class Scope:
    """One section being parsed: its checked raw mapping, its key path, the values read so far (each read on first
    use, so a key's checks and defaults may ask for a sibling's) and the enclosing section's scope."""

    def __init__(self, check: Checker, cls: type, raw: dict, path: str, outer: Scope | None,
                 given: dict[str, Any]) -> None:
        self.check, self.cls, self.raw, self.path, self.outer = check, cls, raw, path, outer
        self.values: dict[str, Any] = dict(given)
        self._fields = {item.name: (item, declared) for item, declared in _keys_of(cls)}

    def fail(self, name: str, message: str) -> None:
        self.check.fail(at(self.path, name), message)

    def value(self, name: str) -> Any:
        """The value of a key of this section, read now if it has not been."""
        if name not in self.values:
            self._read(*self._fields[name])
        return self.values[name]

    def input_format(self) -> str:
        """input.format, for keys that belong to one format: this section's, or the nearest enclosing one's."""
        scope: Scope | None = self
        while scope is not None and "format" not in scope._fields:
            scope = scope.outer
        if scope is None:
            raise TypeError(f"{self.cls.__name__} declares a for_format key outside the input section")
        return scope.value("format")

    def _read(self, item: dataclasses.Field, declared: Key) -> None:
        name = item.name
        given = self.raw.get(name) is not None
        if declared.for_format is not None and given and self.input_format() != declared.for_format:
            label = f"{declared.kind.label} are " if isinstance(declared.kind, Section) else ""
            self.fail(name, f"{label}only for input.format {declared.for_format}, but the format is {self.input_format()}")
        default = declared.default_of(self) if declared.default_of is not None else _default(item, declared.kind)
        excluded = declared.excludes is not None and self.raw.get(declared.excludes) is not None
        value = declared.kind.parse(self, name, None if excluded else default)
        if excluded and given:
            self.fail(name, f"cannot be set together with {declared.excludes} (set one of them)")
        self.values[name] = declared.check(self, value) if declared.check is not None else value


def parse_section(check: Checker, cls: type, raw: Any, path: str, outer: Scope | None = None,
                  given: dict[str, Any] | None = None, flat: bool = False) -> Any:
    """The cls a raw section holds, its problems collected by check; given: values of keys not read from raw."""
    given = given or {}
    scope = Scope(check, cls, raw if isinstance(raw, dict) else {}, path, outer, given)
    if not flat:
        required = tuple(item.name for item, declared in _keys_of(cls) if item.name not in given and (
            declared.required(scope) if callable(declared.required) else declared.required))
        # a section left out reports itself (one level up), not each of its required keys
        scope.raw = check.mapping(raw, path, _yaml_keys(cls, frozenset(given)),
                                  required if raw is not None or not path else ())
    for item, _ in _keys_of(cls):
        scope.value(item.name)
    return cls(**scope.values)


def dump_section(obj: Any, input_format: str | None = None) -> dict[str, Any]:
    """A config dataclass as plain YAML/JSON data, in field order: what parse_section reads back to an equal one."""
    input_format = getattr(obj, "format", input_format)
    result: dict[str, Any] = {}
    for item, declared in _keys_of(type(obj)):
        value = getattr(obj, item.name)
        if declared.for_format is not None and input_format != declared.for_format:
            continue
        if declared.skip_if is not _ALWAYS and value == declared.skip_if:
            continue
        if isinstance(declared.kind, Section) and declared.kind.flatten:
            result.update(dump_section(value, input_format))
        else:
            result[item.name] = declared.kind.dump(value, obj)
    return result
