"""The build config: its frozen dataclasses (schema.py), whose fields declare the YAML keys (keys.py), and the YAML
they are parsed from (parse.py).

Owns what a config holds and how its text is checked, nothing that reads the input: resolving a
config against its input files is tfrbeam.builder.pipeline.resolve; which text encodings a CSV may name is
encodings.py (the CSV readers import it from here). May import tfrbeam.errors and builder.features;
never builder.inputs, whose readers import this package.
"""

from tfrbeam.builder.config.formats import INPUT_FORMATS, ROWS_FORMAT, format_from_path
from tfrbeam.builder.config.keys import parse_size
from tfrbeam.builder.config.parse import (
    MAX_CONFIG_BYTES,
    apply_overrides,
    config_to_dict,
    load_config,
    one_line,
    parse_config,
    parse_yaml,
)
from tfrbeam.builder.config.schema import (
    DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING,
    DEFAULT_MAX_BYTES_PER_SHARD,
    DEFAULT_MAX_GROUP_BYTES,
    BuildConfig,
    CsvOptions,
    ErrorsConfig,
    InputConfig,
    JsonlOptions,
    OutputConfig,
    ParquetOptions,
    SequenceConfig,
    ShuffleConfig,
)
from tfrbeam.builder.config.split_keys import SplitColumn, SplitFiles
from tfrbeam.builder.features.convert import FeatureSpec
from tfrbeam.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BAD_FRACTION_WHEN_KEEPING_GOING",
    "DEFAULT_MAX_BYTES_PER_SHARD",
    "DEFAULT_MAX_GROUP_BYTES",
    "INPUT_FORMATS",
    "MAX_CONFIG_BYTES",
    "ROWS_FORMAT",
    "BuildConfig",
    "ConfigError",
    "CsvOptions",
    "ErrorsConfig",
    "FeatureSpec",
    "InputConfig",
    "JsonlOptions",
    "OutputConfig",
    "ParquetOptions",
    "SequenceConfig",
    "ShuffleConfig",
    "SplitColumn",
    "SplitFiles",
    "apply_overrides",
    "config_to_dict",
    "format_from_path",
    "load_config",
    "one_line",
    "parse_config",
    "parse_size",
    "parse_yaml",
]
