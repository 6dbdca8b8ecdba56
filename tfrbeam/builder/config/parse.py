"""The build config: YAML (plus `--set key.path=value` overrides) parsed into the frozen dataclasses of schema.py.

Everything is checked before any pipeline starts. Every problem is reported as a ConfigError line
`key.path: <what is wrong> (<what is allowed>)`; all problems of a config are reported at once. The keys
themselves, their checks and how they are written back are declared on the dataclasses' fields (keys.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from tfrbeam.builder.config.formats import format_from_path
from tfrbeam.builder.config.keys import Checker, at, config_keys, dump_section, parse_section, show
from tfrbeam.builder.config.schema import BuildConfig
from tfrbeam.errors import ConfigError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_YAML_NODES",
    "apply_overrides",
    "config_to_dict",
    "load_config",
    "one_line",
    "parse_config",
    "parse_yaml",
]

# ----------------------------------------------------------------------------------------- loading


def load_config(path: str, overrides: list[str] | tuple[str, ...] = ()) -> BuildConfig:
    """Read a YAML config file, apply `key.path=value` overrides and validate everything."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise ConfigError(f"cannot read the config file {path}: {error.strerror or error}") from error
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES // 2**20} MiB, far beyond any build config; "
                          f"{_NOT_A_CONFIG_HINT}")
    raw = parse_yaml(_config_text(data, path), path)
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{path}: not a YAML build config (a mapping of sections input, output, ...); "
                          f"it starts with {_first_line(data)}")
    return parse_config(apply_overrides(raw, overrides), where=path)


# A build config is a few KiB; the caps keep a huge file or a YAML alias bomb from eating memory.
MAX_CONFIG_BYTES = 16 * 2**20
MAX_YAML_NODES = 200_000

_NOT_A_CONFIG_HINT = "write one with: tfrbeam infer-config DATA_FILE > build.yaml"
_DATA_MAGIC = ((b"PAR1", "a Parquet"), (b"ORC", "an ORC"), (b"Obj\x01", "an Avro"))


def _config_text(data: bytes, path: str) -> str:
    """The config file's text; a data file (Parquet, ORC, Avro, JSON lines, binary, non-UTF-8) is named as such in one
    line."""
    kind = next((kind for magic, kind in _DATA_MAGIC if data.startswith(magic)), None)
    if kind is None and format_from_path(path) == "jsonl" and not path.lower().endswith(".json"):
        kind = "a JSON lines"  # a .json file may be a config written as JSON (YAML reads it)
    if kind is not None:
        raise ConfigError(f"{path}: not a YAML build config but {kind} data file; {_NOT_A_CONFIG_HINT}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not a YAML build config (byte {error.start} is not UTF-8 text); "
                          f"{_NOT_A_CONFIG_HINT}") from error
    if "\0" in text:
        raise ConfigError(f"{path}: not a YAML build config (it holds NUL bytes); {_NOT_A_CONFIG_HINT}")
    return text


def _first_line(data: bytes, limit: int = 80) -> str:
    line = data.lstrip().split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
    shown = repr(line[:limit] + ("..." if len(line) > limit else ""))
    return f"{shown}; {_NOT_A_CONFIG_HINT}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate mapping keys (plain YAML silently keeps the last one)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    mapping: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in mapping:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (each key may appear once)", key_node.start_mark)
        mapping[key] = loader.construct_object(value_node, deep=deep)
    return mapping


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def parse_yaml(text: str, where: str = "<config>") -> Any:
    """YAML text to Python objects; syntax errors and duplicate keys become a ConfigError with the line.

    Its values are counted from the parser's events (libyaml's when PyYAML has it) before a node is built: a
    document of more than MAX_YAML_NODES is refused naming that; only then are aliases expanded and counted.
    """
    nodes, aliases, line = _counted_values(text, MAX_YAML_NODES)
    if nodes > MAX_YAML_NODES:
        unexpanded = f", not counting what its {aliases:,}+ aliases expand to" if aliases else ""
        raise ConfigError(f"{where}: holds more than {MAX_YAML_NODES:,} YAML values (lists, mappings and scalars; "
                          f"that many by line {line}{unexpanded}), far beyond any build config (a few hundred); "
                          "is it a data file?")
    loader = _UniqueKeyLoader(text)  # a SafeLoader subclass
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded = _expanded_node_count(node, MAX_YAML_NODES) if aliases else nodes
        if expanded > MAX_YAML_NODES:
            raise ConfigError(f"{where}: its YAML aliases (*name) expand to more than {MAX_YAML_NODES:,} values "
                              f"(an alias bomb?); write the repeated parts out or use fewer nested aliases")
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise ConfigError(f"{where}: not valid YAML: {error}") from error
    except RecursionError as error:
        raise ConfigError(f"{where}: nested too deeply to be a build config") from error
    finally:
        loader.dispose()


_EVENT_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader
_VALUE_EVENTS = (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)


def _counted_values(text: str, limit: int) -> tuple[int, int, int]:
    """(values, aliases, 1-based line reached) of a YAML text, from its parser's events, stopping past limit
    values. A syntax error stops the count: composing the text reports it, with the line, as it always has."""
    values = aliases = 0
    line = 1
    try:
        for event in yaml.parse(text, Loader=_EVENT_LOADER):
            if isinstance(event, _VALUE_EVENTS):
                values += 1
                if values > limit:
                    line = event.start_mark.line + 1 if event.start_mark is not None else 0
                    break
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
    except yaml.YAMLError:
        pass
    return values, aliases, line


def _expanded_node_count(root: yaml.Node, limit: int) -> int:
    """How many nodes the YAML graph has once every alias is expanded; stops counting past `limit`."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        sizes[id(node)] = limit + 1  # a cycle (a recursive alias) counts as too many
        total = 1
        children = node.value if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)) else []
        for child in children:
            total += sum(size(part) for part in child) if isinstance(child, tuple) else size(child)
            if total > limit:
                break
        sizes[id(node)] = min(total, limit + 1)
        return sizes[id(node)]

    return size(root)


def apply_overrides(raw: Any, overrides: list[str] | tuple[str, ...]) -> dict:
    """Return a copy of the raw config with each `key.path=value` set; values are parsed as YAML."""
    result = _deep_copy(raw if raw is not None else {})
    if not isinstance(result, dict):
        raise ConfigError(f"the config must be a mapping of sections (input, features, ...), got {show(raw)}")
    for override in overrides:
        key_path, sep, text = override.partition("=")
        keys = key_path.strip().split(".")
        if not sep or not all(keys):
            raise ConfigError(f"--set {override!r}: expected key.path=value, e.g. --set shuffle.seed=7")
        value = parse_yaml(text, f"--set {override!r}") if text.strip() else None
        node = result
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                parent = ".".join(keys[: depth + 1])
                raise ConfigError(
                    f"--set {override!r}: {parent} is {show(child)}, not a mapping, so it has no key {keys[depth + 1]!r}"
                )
            node = child
        node[keys[-1]] = value
    _drop_excluded_siblings(result, overrides)
    return result


def _drop_excluded_siblings(raw: dict, overrides: list[str] | tuple[str, ...]) -> None:
    """--set of one of two keys that exclude each other (output.num_shards, output.max_bytes_per_shard) replaces the
    other when the config file sets it."""
    set_paths = [override.partition("=")[0].strip() for override in overrides]
    for path, declared in config_keys(BuildConfig):
        if declared.excludes is None:
            continue
        section_path, _, name = path.rpartition(".")
        pair = (name, declared.excludes)
        chosen = [key for key in pair
                  if any(set_path == at(section_path, key) or set_path.startswith(at(section_path, key) + ".")
                         for set_path in set_paths)]
        section = _section_at(raw, section_path)
        if len(chosen) == 1 and isinstance(section, dict):
            section.pop(pair[1 - pair.index(chosen[0])], None)


def _section_at(raw: dict, path: str) -> Any:
    section: Any = raw
    for name in path.split(".") if path else ():
        section = section.get(name) if isinstance(section, dict) else None
    return section


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_deep_copy(item) for item in value]
    return value




def one_line(error: ConfigError) -> ConfigError:
    """A config error listing its problems on one line ("heading: first; second") instead of one per line."""
    text = str(error)
    if "\n" not in text:
        return error
    heading, _, problems = text.partition(":\n")
    return ConfigError(f"{heading}: {'; '.join(line.strip() for line in problems.splitlines() if line.strip())}")


def parse_config(raw: Any, where: str = "<config>", given: Mapping[str, Any] | None = None) -> BuildConfig:
    """Validate a raw (YAML-loaded) config and build the BuildConfig; all problems raise one ConfigError.

    given: values of top-level keys that come from the caller, not the YAML (write_dataset's input and
    FeatureSpecs); the YAML may not set those keys.
    """
    check = Checker()
    config = parse_section(check, BuildConfig, raw, "", given=dict(given or {}))
    if check.problems:
        count = len(check.problems)
        heading = f"{where}: {count} problem{'s' if count > 1 else ''} in the build config:\n  "
        raise ConfigError(heading + "\n  ".join(check.problems))
    return config


def config_to_dict(config: BuildConfig) -> dict:
    """The full resolved config as plain YAML/JSON data; parse_config(config_to_dict(c)) == c."""
    return dump_section(config)
