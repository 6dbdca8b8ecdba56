"""A YAML config is bounded before it is composed, and a refusal names the real cause (issue 43, item 5).

Measured before: a 4 MB config with no aliases (the file cap is 16 MiB) took 68 s and 1.47 GB to compose, then
blamed "YAML aliases ... (an alias bomb?)" that it did not hold. Its values are now counted from the parser's
events, stopping past the cap, before a node is built.
"""

from __future__ import annotations

import pytest

from tests.builder.inputs.bounded import run_bounded
from tfrbeam.builder.config import load_config, parse_yaml
from tfrbeam.builder.config.parse import MAX_YAML_NODES
from tfrbeam.errors import ConfigError

_HEAD = "input: {path: x.csv}\noutput: {path: o}\n"


def test_a_4_mb_config_of_plain_values_is_refused_in_seconds_naming_the_value_count(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(_HEAD + "notes: [" + "1, " * 1_300_000 + "1]\n")
    assert 3_900_000 < path.stat().st_size < 4_000_000
    outcome = run_bounded(f"load_config({str(path)!r})", setup="from tfrbeam.builder.config import load_config",
                          budget=1 << 30, timeout=60)
    assert outcome.type == "ConfigError", outcome
    assert outcome.error == (f"{path}: holds more than 200,000 YAML values (lists, mappings and scalars; that many by "
                             "line 3), far beyond any build config (a few hundred); is it a data file?")
    assert outcome.seconds < 10, outcome
    assert outcome.rss_growth < 300 << 20, outcome


def test_many_values_with_a_few_aliases_name_the_count_not_an_alias_bomb(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(_HEAD + "a: &one 1\nb: [" + "*one, " * 10 + "1, " * (MAX_YAML_NODES + 10) + "1]\n")
    with pytest.raises(ConfigError) as refused:
        load_config(str(path))
    message = str(refused.value)
    assert "holds more than 200,000 YAML values" in message and "not counting what its 10+ aliases expand to" in message
    assert "alias bomb" not in message


def test_an_alias_bomb_is_still_named_as_one():
    bomb = "\n".join([f'a0: &a0 [{", ".join(["lol"] * 9)}]']
                     + [f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]" for level in range(1, 9)])
    with pytest.raises(ConfigError, match=r"its YAML aliases \(\*name\) expand to more than 200,000 values"):
        parse_yaml(bomb, "bomb.yaml")


def test_syntax_errors_and_duplicate_keys_keep_their_messages():
    with pytest.raises(ConfigError, match=r"(?s)x.yaml: not valid YAML: .*line 2"):
        parse_yaml("a: 1\nb: [1, 2\n", "x.yaml")
    with pytest.raises(ConfigError, match=r"duplicate key 'a'"):
        parse_yaml("a: 1\na: 2\n", "x.yaml")
    assert parse_yaml("a: &x {b: [1, 2]}\nc: *x\n") == {"a": {"b": [1, 2]}, "c": {"b": [1, 2]}}
