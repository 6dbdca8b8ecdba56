"""The exit status of every ``tfrbeam`` command, from the error that ended it, and the one line reporting it.

0: done. 1 (EXIT_FAILED): the data or the run failed (a bad or damaged record, a failed build, a
locked output, a storage error, a write the disk refused). 2 (EXIT_USAGE): what was given must
change first (the command line, the config, a path that does not exist, an output in the way or
not writable). 128 + N: ended by signal N (130 after Ctrl-C). docs/build-config.md#exit-statuses.
"""

from __future__ import annotations

import signal
import sys

from tfrbeam.errors import ConfigError, OutputExistsError, OutputNotWritableError, TfrbeamError

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "USAGE_ERRORS", "exit_code_for", "report_error"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# Errors about what the user gave (subclasses included: UnsafeOutputError is a ConfigError, a missing object a
# FileNotFoundError); every other error of ours, and any other OSError, is EXIT_FAILED.
USAGE_ERRORS: tuple[type[BaseException], ...] = (ConfigError, OutputExistsError, OutputNotWritableError, FileNotFoundError)


def exit_code_for(error: BaseException) -> int:
    """The exit status a command ends with after ``error``, whichever command it is."""
    if isinstance(error, KeyboardInterrupt):
        return 128 + signal.SIGINT
    return EXIT_USAGE if isinstance(error, USAGE_ERRORS) else EXIT_FAILED


def report_error(program: str, error: BaseException) -> int:
    """Print ``error`` as one plain line on stderr (``PROGRAM: error: ...``, no class name); return its exit status."""
    print(f"{program}: error: {_error_line(error)}", file=sys.stderr)
    return exit_code_for(error)


def _error_line(error: BaseException) -> str:
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    if isinstance(error, OSError) and not isinstance(error, TfrbeamError):  # ours name their path themselves
        where = f"{error.filename}: " if error.filename else ""
        reason = error.strerror or str(error)
        if isinstance(error, FileNotFoundError):
            return f"{where}{reason}"
        return f"{where}{reason}; files already at their final names are whole"  # a full disk, a refused write
    return str(error)
