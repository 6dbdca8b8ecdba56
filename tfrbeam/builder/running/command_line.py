"""Beam's options from a build command's line: every option the command does not know must be Beam's.

``tfrbeam build`` parses its own options and hands the rest here, so the command itself imports no
Beam. An option neither knows, a bad value, or a runner Beam cannot create is one ConfigError line
with a did-you-mean, never Beam's usage text and exit (Beam would also drop an unknown option silently).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
from typing import NoReturn

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from tfrbeam.builder.pipeline.runners import known_runner
from tfrbeam.builder.running.launch import build_options
from tfrbeam.errors import ConfigError

__all__ = ["pipeline_options"]


def pipeline_options(arguments: list[str], command: argparse.ArgumentParser) -> PipelineOptions:
    """Beam's options from the ``arguments`` the ``command``'s own parser left, with the build's defaults.

    Raises ConfigError for an argument no parser knows, a bad value, or a runner Beam cannot create
    (Dataflow without the options it cannot run without).
    """
    _import_named_runner(arguments)
    beam_parser = _beam_argument_parser()
    _, unknown = beam_parser.parse_known_args(arguments)
    if unknown:
        raise ConfigError(_unknown_argument(unknown[0], [*_option_strings(command), *_option_strings(beam_parser)]))
    options = build_options(arguments)
    _check_runner(options)
    return options


def _import_named_runner(arguments: list[str]) -> None:
    """A runner given by module path (``--runner pkg.module.Class``) registers its options when imported."""
    runner = None
    for index, argument in enumerate(arguments):
        if argument.startswith("--runner="):
            runner = argument.split("=", 1)[1]
        elif argument == "--runner" and index + 1 < len(arguments):
            runner = arguments[index + 1]
    if runner and "." in runner:
        module = runner.rsplit(".", 1)[0]
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(f"--runner: cannot import {module} ({error}); install the runner's package") from error


def _beam_argument_parser() -> argparse.ArgumentParser:
    """The parser Beam builds from every options class, taken from ``get_all_options``' public callback.

    A bad value on it is one ConfigError line, not Beam's 129-line usage and exit.
    """
    parsers: list[argparse.ArgumentParser] = []

    def keep(parser: argparse.ArgumentParser) -> None:
        parser.error = _one_line_beam_error  # type: ignore[method-assign]
        parsers.append(parser)

    PipelineOptions([]).get_all_options(add_extra_args_fn=keep)
    return parsers[0]


def _one_line_beam_error(message: str) -> NoReturn:
    raise ConfigError(f"Beam option: {message}")


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [name for name in parser._option_string_actions if name.startswith("--")]  # argparse keeps no public list


def _unknown_argument(argument: str, known: list[str]) -> str:
    if not argument.startswith("-"):
        return f"unexpected argument {argument!r} (the config is the one positional argument; options start with --)"
    name = argument.split("=", 1)[0]
    return f"unknown option {name}{_did_you_mean(name, known, quote=False)}"


def _did_you_mean(word: str, choices: list[str], quote: bool = True) -> str:
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not match:
        return ""
    return f"; did you mean {match[0]!r}?" if quote else f"; did you mean {match[0]}?"


_DATAFLOW_REQUIRED = (("project", "--project"), ("region", "--region"), ("temp_location", "--temp_location"))


def _check_runner(options: PipelineOptions) -> None:
    """A runner Beam can create, and for Dataflow the project, region and temp_location it needs."""
    runner = options.view_as(StandardOptions).runner
    if not isinstance(runner, str):
        return
    if "." not in runner and known_runner(runner) is None:
        raise ConfigError(f"--runner: {runner!r} is not a Beam runner"
                          f"{_did_you_mean(runner, list(StandardOptions.KNOWN_RUNNER_NAMES))} "
                          f"(runners: {', '.join(StandardOptions.KNOWN_RUNNER_NAMES)})")
    if known_runner(runner) == "DataflowRunner":
        cloud = options.view_as(GoogleCloudOptions)
        missing = [flag for attribute, flag in _DATAFLOW_REQUIRED if not getattr(cloud, attribute)]
        if missing:
            listed = missing[0] if len(missing) == 1 else ", ".join(missing[:-1]) + " and " + missing[-1]
            raise ConfigError(f"--runner DataflowRunner needs {listed} "
                              "(e.g. --project my-project --region us-central1 --temp_location gs://my-bucket/tmp)")
