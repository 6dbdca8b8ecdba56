"""Beam's import-time warnings about its optional extras, held back from the commands' output (no Beam import here).

Beam logs "apitools not found, ..." on import when its gcp extra is not installed, and (Beam 2.72 to 2.7x) "crcmod
package not found ..." when its tfrecord extra is not: tfrbeam needs neither (it computes CRCs with crc32c), so
they are noise on every command of a plain install. Exactly those records are dropped, and only while a command
runs: any other warning, and these outside a command, pass.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

_IMPORT_WARNINGS = ("apitools not found", "crcmod package not found")


class _DropBeamImportWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(_IMPORT_WARNINGS))


@contextlib.contextmanager
def without_beam_import_warnings() -> Iterator[None]:
    """Drop Beam's import-time warnings about its optional extras, and no other record, from the root logger meanwhile."""
    dropping = _DropBeamImportWarnings()
    logging.root.addFilter(dropping)
    try:
        yield
    finally:
        logging.root.removeFilter(dropping)
