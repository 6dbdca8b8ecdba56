"""One exit status per error, whichever command ends with it (tfrbeam/cli/exit_codes.py, docs/build-config.md)."""

from __future__ import annotations

import errno
import inspect
import pathlib
import signal

import pytest

from tests.example_builds import REPO_ROOT, build_examples
from tfrbeam import errors
from tfrbeam.cli.exit_codes import EXIT_FAILED, EXIT_USAGE, exit_code_for
from tfrbeam.cli.file_tools import NoInputError
from tfrbeam.cli.main import main

# The errors about what the user gave, exit 2; every other error of ours is exit 1.
USAGE = {"ConfigError", "OutputExistsError", "OutputNotWritableError", "UnsafeOutputError", "ObjectNotFoundError"}


def _bare(cls: type[BaseException]) -> BaseException:
    """An instance without running the constructor (some take the file and offset, not a message)."""
    return cls.__new__(cls)


def test_every_error_of_ours_has_the_exit_status_of_its_kind():
    ours = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, errors.TfrbeamError)]
    assert len(ours) > 30
    codes = {cls.__name__: exit_code_for(_bare(cls)) for cls in ours}
    assert {name for name, code in codes.items() if code == EXIT_USAGE} == USAGE
    assert {code for name, code in codes.items() if name not in USAGE} == {EXIT_FAILED}
    assert exit_code_for(_bare(NoInputError)) == EXIT_USAGE  # a path given that names nothing
    assert exit_code_for(OSError(errno.ENOSPC, "No space left on device", "out/x")) == EXIT_FAILED
    assert exit_code_for(FileNotFoundError(errno.ENOENT, "No such file or directory", "in/x")) == EXIT_USAGE
    assert exit_code_for(KeyboardInterrupt()) == 128 + signal.SIGINT


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> pathlib.Path:
    return build_examples(tmp_path_factory.mktemp("exit_codes"), "demo.yaml")["demo"]


@pytest.mark.parametrize("command", ["build", "stats", "export"])
def test_an_output_that_cannot_be_written_is_exit_2_from_every_command(command, dataset, tmp_path, monkeypatch, capsys):
    """The output path lies under a regular file: `build` said exit 2, `stats` and `export` said 1."""
    monkeypatch.chdir(dataset.parent.parent)  # the demo config's relative paths
    (tmp_path / "a_file").write_text("not a directory")
    output = str(tmp_path / "a_file" / "out")
    argv = {"build": ["build", str(REPO_ROOT / "configs" / "demo.yaml"), "--set", f"output.path={output}"],
            "stats": ["stats", str(dataset), "--output-dir", output],
            "export": ["export", str(dataset), output]}[command]
    assert main(argv) == EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(("tfrbeam: error: ", "tfrbeam build: error: ")), lines
    assert "a_file" in lines[0] and "Error" not in lines[0], lines
    assert not (tmp_path / "a_file" / "out").exists()


def test_a_locked_output_is_exit_1_from_build_and_export(dataset, tmp_path, monkeypatch, capsys):
    """Another run holds the lock: nothing is wrong with what was given, so it is not a usage error."""
    from tfrbeam.beam.publish import OutputLock, this_run

    monkeypatch.chdir(dataset.parent.parent)
    output = tmp_path / "locked"
    with OutputLock(str(output), this_run("another0run0id00")):
        assert main(["export", str(dataset), str(output)]) == EXIT_FAILED
        assert main(["build", str(REPO_ROOT / "configs" / "demo.yaml"), "--quiet", "--set",
                     f"output.path={output}"]) == EXIT_FAILED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all("another0run0id00" in line for line in lines), lines
