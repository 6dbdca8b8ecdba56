"""Fault injection for the file-system layer, and the invariants a publish must keep under it.

Every operation that changes a file goes through ``tfrbeam.base.fileops.mutating``: Beam's file
systems through ``tfrbeam.beam.filesystem``, which calls it, and the framing writers, indexes,
stats and export directly. This module wraps that one function. Inside a *scope* (the build's
commit step and the launcher's publish after the pipeline, the sink's finalize, or the whole of a
``stats`` or ``export`` run) it numbers the operations and, at operation ``at``, either kills the
process on the spot (``crash``: ``os._exit``, nothing runs after it, as under ``kill -9``) or raises
ENOSPC / EACCES as the disk would. ``python -m tests.faults KIND AT LOG -- COMMAND ARGS...`` runs
``tfrbeam COMMAND`` (build, stats, export) or the sink under a fault in a fresh process; ``LOG``
receives one line per operation in scope.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tfrbeam.base import fileops
from tfrbeam.cli.beam_warnings import without_beam_import_warnings

KINDS = ("crash", "enospc", "eacces", "wait")
CRASH_EXIT = 137
_state = threading.local()


class _Scope:
    """Counts operations while one of the wrapped steps runs (any thread)."""

    def __init__(self) -> None:
        self.active = 0
        self.count = 0
        self.lock = threading.Lock()


_SCOPE = _Scope()


@contextlib.contextmanager
def injected(kind: str | None, at: int, log: list[str] | None = None, signal_path: str | None = None) -> Iterator[None]:
    """Wrap the file-system layer: operation number ``at`` (1-based, in scope) fails as ``kind``; None only logs.

    ``wait`` pauses there instead: it creates ``signal_path + ".waiting"`` and goes on once
    ``signal_path + ".go"`` exists (so a test can act while a commit holds the lock).
    """
    original = fileops.mutating

    def mutating(op: str, path: str, action: Callable[[], Any]) -> Any:
        if _SCOPE.active:
            with _SCOPE.lock:
                _SCOPE.count += 1
                number = _SCOPE.count
            if log is not None:
                log.append(f"{number} {op} {path}")
            if kind == "wait" and number == at:
                _pause(signal_path or "fault")
            elif kind is not None and number == at:
                _fail(kind, op, path)
        return original(op, path, action)

    _SCOPE.count = 0
    fileops.mutating = mutating
    try:
        with _scoped_steps():
            yield
    finally:
        fileops.mutating = original


def _pause(signal_path: str) -> None:
    import time

    open(signal_path + ".waiting", "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(signal_path + ".go") and time.monotonic() < deadline:
        time.sleep(0.01)


def _fail(kind: str, op: str, path: str) -> None:
    if kind == "crash":
        sys.stdout.flush()
        os._exit(CRASH_EXIT)
    code = errno.ENOSPC if kind == "enospc" else errno.EACCES
    raise OSError(code, os.strerror(code), path)


@contextlib.contextmanager
def _scoped_steps() -> Iterator[None]:
    """Count only inside the build's commit and the sink's finalize."""
    from tfrbeam.beam.sink import Finalizer
    from tfrbeam.builder.pipeline import commit
    from tfrbeam.builder.pipeline.commit import CommitDataset

    process, run, launcher_commit = CommitDataset.process, Finalizer.run, commit.commit_staged

    def scoped_process(self, *args, **kwargs):
        _SCOPE.active += 1
        try:
            yield from process(self, *args, **kwargs)
        finally:
            _SCOPE.active -= 1

    def scoped_run(self, *args, **kwargs):
        _SCOPE.active += 1
        try:
            return run(self, *args, **kwargs)
        finally:
            _SCOPE.active -= 1

    def scoped_commit(plan):
        _SCOPE.active += 1
        try:
            return launcher_commit(plan)
        finally:
            _SCOPE.active -= 1

    CommitDataset.process, Finalizer.run, commit.commit_staged = scoped_process, scoped_run, scoped_commit
    try:
        yield
    finally:
        CommitDataset.process, Finalizer.run, commit.commit_staged = process, run, launcher_commit


def main(argv: list[str]) -> int:
    """``KIND AT LOG -- COMMAND ARGS...``: run ``tfrbeam COMMAND ARGS`` (build, stats, export, or the sink) under one fault."""
    kind, at, log_path = argv[0], int(argv[1]), argv[2]
    separator = argv.index("--")
    command, args = argv[separator + 1], argv[separator + 2:]
    log: list[str] = []
    try:
        # The harness imports Beam before the command does (to hook it): hold back Beam's import-time noise as the
        # console script's commands do.
        with without_beam_import_warnings(), injected(None if kind == "none" else kind, at, log, signal_path=log_path):
            if command == "build":
                from tfrbeam.cli.build import main as build_main

                return build_main(args)
            if command == "sink":
                return _sink_main(args)
            if command in ("stats", "export"):  # a tool run is in scope from start to end
                from tfrbeam.cli.main import main as cli_main

                _SCOPE.active += 1
                try:
                    return cli_main([command, *args])
                finally:
                    _SCOPE.active -= 1
            raise SystemExit(f"unknown command {command}")
    finally:
        with open(log_path, "w") as handle:
            handle.write("\n".join(log) + "\n")


def _sink_main(args: list[str]) -> int:
    """``sink PREFIX N_RECORDS NUM_SHARDS``: write records ``b'<n>-<i>'`` with WriteToTFRecord(overwrite=True)."""
    import apache_beam as beam

    from tfrbeam.beam.sink import WriteToTFRecord

    prefix, count, shards = args[0], int(args[1]), int(args[2])
    with beam.Pipeline() as pipeline:
        _ = (pipeline | beam.Create([b"%d-%d" % (count, i) for i in range(count)])
             | WriteToTFRecord(prefix, num_shards=shards, overwrite=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
