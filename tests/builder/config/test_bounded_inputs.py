"""Configs and command lines that would cost gigabytes or a page of usage are refused in one line."""

from __future__ import annotations

import resource

import pytest

from tfrbeam.builder.config import MAX_CONFIG_BYTES, load_config
from tfrbeam.cli.build import main as build_main
from tfrbeam.cli.main import main
from tfrbeam.errors import ConfigError

_ALIAS_BOMB = "\n".join(
    [f'a0: &a0 [{", ".join(["lol"] * 9)}]']
    + [f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 9)}]" for level in range(1, 9)]
)


def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_ALIAS_BOMB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ConfigError, match=r"bomb\.yaml: its YAML aliases .* expand to more than"):
        load_config(str(path))
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200_000  # 9**9 expanded values would be gigabytes


def test_a_recursive_alias_and_deep_nesting_are_one_line_errors(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(str(deep))


def test_a_few_ordinary_aliases_still_work(tmp_path):
    path = tmp_path / "build.yaml"
    path.write_text(
        "input: {path: data.csv}\n"
        "output: {path: out}\n"
        "common: &number {type: float}\n"
        "features:\n  a: *number\n  b: *number\n"
    )
    with pytest.raises(ConfigError) as refused:  # "common" is not a section: the aliases themselves parsed
        load_config(str(path))
    assert "common" in str(refused.value)


def test_a_config_over_16_mib_is_refused_before_parsing(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:
        handle.write(b"# " + b"x" * (MAX_CONFIG_BYTES + 10))
    with pytest.raises(ConfigError, match=r"huge\.yaml: larger than 16 MiB"):
        load_config(str(path))


@pytest.mark.parametrize(("option", "expected"), [
    ("--direct_num_workers=abc", "--direct_num_workers: invalid int value: 'abc'"),
    ("--direct_running_mode=fast", "--direct_running_mode: invalid choice: 'fast'"),
])
def test_a_bad_beam_option_value_is_one_line_naming_the_option(tmp_path, capsys, option, expected):
    config = tmp_path / "build.yaml"
    config.write_text("input: {path: data.csv}\noutput: {path: out}\n")
    code = build_main([str(config), option])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1, err
    assert "usage:" not in err


def test_an_unknown_option_after_a_command_shows_that_commands_usage(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["verify", str(tmp_path), "--bogus"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert err.startswith("usage: tfrbeam verify")
    assert "unrecognized arguments: --bogus" in err


@pytest.mark.parametrize(("argv", "expected"), [
    (["cat", "x.tfrecord", "--limit", "-1"], "--limit: must be 0 or more, got -1"),
    (["inspect", "x.tfrecord", "--limit", "ten"], "--limit: expected a whole number of records, got 'ten'"),
    (["stats", "ds", "--workers", "0"], "--workers: must be 1 or more, got 0"),
])
def test_negative_or_non_numeric_counts_are_usage_errors(capsys, argv, expected):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert expected in capsys.readouterr().err
